"""Process groups: which ranks take part in a collective.

A group is a sorted tuple of *global* ranks and a name. As in torch.distributed, a rank's
position in the group (its group rank) is its index in that sorted tuple, reductions run
in that order, and `src`/`dst` arguments are global ranks.

Unlike `torch.distributed.new_group`, making a group here is not itself a collective: a
group is identified by its name and its ranks, so two calls with the same name and ranks,
on any ranks, give the same group. Different names give different groups over the same
ranks (separate call counters, as separate NCCL communicators would have).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional


@dataclass(frozen=True)
class ProcessGroup:
    """A named, sorted set of global ranks."""

    ranks: tuple[int, ...]
    name: str = "group"
    size: int = field(init=False, repr=False, compare=False)
    key: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # computed once: every collective looks these up
        object.__setattr__(self, "size", len(self.ranks))
        object.__setattr__(self, "key", (self.name, self.ranks))

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


def make_group(ranks: Iterable[int], world_size: int, name: Optional[str] = None) -> ProcessGroup:
    """Validate and build a group over `ranks` of a world of `world_size`."""
    rs = tuple(sorted(int(r) for r in ranks))
    if not rs:
        raise ValueError("a process group needs at least one rank")
    if len(set(rs)) != len(rs):
        raise ValueError(f"a process group lists each rank once; got duplicates in {list(ranks)}")
    bad = [r for r in rs if not 0 <= r < world_size]
    if bad:
        raise ValueError(f"ranks {bad} are outside the world of size {world_size} "
                         f"(valid ranks are 0..{world_size - 1})")
    return ProcessGroup(rs, name or ("world" if len(rs) == world_size else "group"))
