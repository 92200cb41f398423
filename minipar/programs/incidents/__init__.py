"""Incident cases, runnable: each reproduces a failure's mechanism on simulated devices,
prints what it measured and returns the numbers.

    name  module              what goes wrong
    a     tp_across_nodes     a tensor-parallel group spanning nodes: all-reduces on InfiniBand
    b     pipeline_bubble     PP = 64 with 4 (or 32) micro-batches: the bubble bounds MFU
    c     zero3_recompute     ZeRO-3 + activation checkpointing peaks above ZeRO-2

Each also sets the planner's prediction at the seed's own scale beside the seed's numbers
(planned.py: which hold, which do not). Every module has `run(out=print) -> dict`;
`minipar incident <name>` runs one. To add an
incident, write its module, import it here and list it in INCIDENTS.
"""

from __future__ import annotations

from types import ModuleType

from . import pipeline_bubble, tp_across_nodes, zero3_recompute

# name -> (its module, one line on what goes wrong)
INCIDENTS: dict[str, tuple[ModuleType, str]] = {
    "a": (tp_across_nodes, "tensor parallelism across nodes puts its all-reduces on "
                           "InfiniBand (keep TP inside the node, DP/PP across)"),
    "b": (pipeline_bubble, "a deep pipeline with few micro-batches idles (p - 1)/(m + p - 1) "
                           "of the step (more micro-batches, or interleaving)"),
    "c": (zero3_recompute, "ZeRO-3 + activation checkpointing peaks above ZeRO-2 "
                           "(limit_all_gathers; checkpoint segments of 2 layers)"),
}


def get(name: str) -> ModuleType:
    """The module of incident `name` ("a", "c", ...)."""
    if name not in INCIDENTS:
        raise KeyError(f"no incident {name!r}; the incidents are {sorted(INCIDENTS)}")
    return INCIDENTS[name][0]


__all__ = ["INCIDENTS", "get"]
