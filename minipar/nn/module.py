"""A module lists its parameters in the order of `parameter_order`, a tuple of its attribute names.

    class Block(Module):
        parameter_order = ("ln1", "attn", "ln2", "mlp")   # parameters(): ln1's, attn's, ...

`parameters()` walks those attributes in that order. Each is a `Parameter`, `None` (an
absent bias, a tied head: nothing), a list of parts (the blocks, in list order) or any
object with `parameters()` — a `Module`, or a stand-in such as a mixture of experts that
only has the method. A parameter reached twice (a tied weight) is listed once, where it
is first reached, as torch's `Module.parameters()` does.

The order is part of the model's contract, not a detail: flat buffers, DDP's buckets and
checkpoints lay parameters out in it (tests/nn/test_parts.py pins GPT's). torch derives it
from the order attributes are assigned in `__init__`; here it is written down, so a reader
sees where it comes from and a refactor of a constructor cannot change it.
"""

from __future__ import annotations

from typing import Any

from .parameter import Parameter


def parameters_of(part: Any) -> list[Parameter]:
    """The parameters of one attribute's value: a Parameter, None, a list, or a part."""
    if part is None:
        return []
    if isinstance(part, Parameter):
        return [part]
    if isinstance(part, (list, tuple)):
        return [p for item in part for p in parameters_of(item)]
    if not hasattr(part, "parameters"):
        raise TypeError(f"{type(part).__name__} is neither a Parameter nor a part with "
                        "parameters(): give it parameters() (subclass minipar.nn.Module) or "
                        "leave it out of parameter_order")
    return list(part.parameters())


class Module:
    """parameters(), named_parameters(), num_parameters() and zero_grad() from
    `parameter_order`; subclasses provide forward/backward."""

    #: the attributes holding this module's parameters and parts, in parameter order
    parameter_order: tuple[str, ...] = ()

    def parameters_from(self, *attributes: str) -> list[Parameter]:
        """The parameters of `attributes`, in the order given (each parameter once)."""
        out: list[Parameter] = []
        seen: set[int] = set()
        for attribute in attributes:
            for p in parameters_of(getattr(self, attribute)):
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def parameters(self) -> list[Parameter]:
        """Every parameter once, in `parameter_order`."""
        return self.parameters_from(*self.parameter_order)

    def named_parameters(self) -> dict[str, Parameter]:
        """{parameter name: parameter}, in parameter order (names are the full dotted
        names the parameters were made with, e.g. "blocks.0.attn.qkv.weight")."""
        return {p.name: p for p in self.parameters()}

    def num_parameters(self) -> int:
        """Elements held by this rank (a shard counts its own elements)."""
        return sum(p.size for p in self.parameters())

    def zero_grad(self) -> None:
        """Drop every parameter's gradient (its bytes go back to the ledger)."""
        for p in self.parameters():
            p.free_grad()
