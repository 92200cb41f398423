"""The seed's 3-D examples, runnable: `minipar example <name>`.

    name     module      what it shows
    kitchen  kitchen     DP = 2 x TP = 4 x PP = 3 on 24 GPUs: every rank's coordinate and
                         groups, each group's bytes by link class, one device's loss and
                         gradients
    70b      seventy_b   64 GPUs on nodes of 8, TP = 4, PP = 2, DP = 8: a tiny model run
                         (bytes measured from the trace), the same bytes and times computed
                         at 70B width, the seed's claims checked against both
    7b       small_model the "<= 7B: DDP + ZeRO-2" rule: a GPU's memory, computed

Every module has `run(out=print) -> dict`. traffic.py splits a trace's bytes by link class
and predicts them from a model's shape; common.py runs one 3-D step next to one device.
"""

from __future__ import annotations

from types import ModuleType

from . import kitchen, seventy_b, small_model

# name -> (its module, one line on what it shows)
EXAMPLES: dict[str, tuple[ModuleType, str]] = {
    "kitchen": (kitchen, "DP = 2 x TP = 4 x PP = 3 on 24 GPUs, forward and backward equal "
                         "to one device, each group's bytes by link class"),
    "70b": (seventy_b, "64 GPUs, TP = 4, PP = 2, DP = 8 on nodes of 8: bytes per link class "
                       "measured small and computed at 70B, the seed's claims checked"),
    "7b": (small_model, "the '<= 7B: DDP + ZeRO-2, no PP' rule: memory a GPU by sequence "
                        "length and recompute, and the bubble PP would add"),
}


def get(name: str) -> ModuleType:
    """The module of example `name` ("kitchen", "70b", "7b")."""
    if name not in EXAMPLES:
        raise KeyError(f"no example {name!r}; the examples are {sorted(EXAMPLES)}")
    return EXAMPLES[name][0]


__all__ = ["EXAMPLES", "get"]
