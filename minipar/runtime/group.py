"""Process groups: which ranks take part in a collective.

A group is a sorted tuple of *global* ranks and a name. As in torch.distributed, a rank's
position in the group (its group rank) is its index in that sorted tuple, reductions run
in that order, and `src`/`dst` arguments are global ranks.

Unlike `torch.distributed.new_group`, making a group here is not itself a collective: a
group is identified by its name and its ranks, so two calls with the same name and ranks,
on any ranks, give the same group. Different names give different groups over the same
ranks (separate call counters, as separate NCCL communicators would have).

So a group made in another launch works in this one, as long as its ranks exist here; one
whose ranks do not (made for a world of another size) is refused at its first call
(`check_world`), instead of waiting forever for ranks that will never arrive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Optional

from .checks import whole
from .errors import CollectiveUsageError


@dataclass(frozen=True)
class ProcessGroup:
    """A named, sorted set of global ranks."""

    ranks: tuple[int, ...]
    name: str = "group"
    #: the world size it was made for, when known (new_group), to explain a misuse
    world_size: Optional[int] = field(default=None, repr=False, compare=False)
    size: int = field(init=False, repr=False, compare=False)
    key: tuple = field(init=False, repr=False, compare=False)
    span: tuple = field(init=False, repr=False, compare=False)  # (lowest, highest) rank

    def __post_init__(self):
        # computed once: every collective looks these up
        object.__setattr__(self, "size", len(self.ranks))
        object.__setattr__(self, "key", (self.name, self.ranks))
        object.__setattr__(self, "span", (min(self.ranks, default=0),
                                          max(self.ranks, default=0)))

    def group_rank(self, global_rank: int) -> int:
        """Position of `global_rank` in the group (torch's get_group_rank)."""
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise ValueError(
                f"rank {global_rank} is not a member of group {self.name!r} {list(self.ranks)}"
            ) from None

    def __contains__(self, rank: int) -> bool:
        return rank in self.ranks

    def __str__(self) -> str:
        return f"{self.name}{list(self.ranks)}"

    def check_world(self, world_size: int, rank: int, kind: str) -> None:
        """Refuse a group with ranks this world does not have (made for another world)."""
        if self.span[0] >= 0 and self.span[1] < world_size:
            return
        missing = [r for r in self.ranks if not 0 <= r < world_size]
        if missing:
            made = ("" if self.world_size is None else
                    f"it was made in a world of {self.world_size} ranks, ")
            raise CollectiveUsageError(
                f"rank {rank}: {kind} on group {self}, whose ranks {missing} do not exist in "
                f"this world of {world_size} ranks: {made}in another launch or for another "
                f"world size. Make groups inside the program that uses them (mp.new_group, "
                f"mp.init_device_mesh or ParallelGroups), so they fit the world it runs on")


def make_group(ranks: Iterable[int], world_size: int, name: Optional[str] = None) -> ProcessGroup:
    """Validate and build a group over `ranks` of a world of `world_size`."""
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
        raise TypeError(f"new_group takes a list of global ranks like [0, 1], got "
                        f"{type(ranks).__name__} {ranks!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"a process group's name is a string, got {type(name).__name__} "
                        f"{name!r}")
    ranks = list(ranks)
    rs = tuple(sorted(whole(r, f"a rank of new_group({ranks!r})", minimum=0) for r in ranks))
    if not rs:
        raise ValueError("a process group needs at least one rank")
    if len(set(rs)) != len(rs):
        raise ValueError(f"a process group lists each rank once; got duplicates in {list(ranks)}")
    bad = [r for r in rs if not 0 <= r < world_size]
    if bad:
        raise ValueError(f"ranks {bad} are outside the world of size {world_size} "
                         f"(valid ranks are 0..{world_size - 1})")
    return ProcessGroup(rs, name or ("world" if len(rs) == world_size else "group"),
                        world_size)
