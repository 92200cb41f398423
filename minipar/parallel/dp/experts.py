"""How a data-parallel engine reduces a mixture of experts' expert parameters.

On a mesh with expert parallelism (ep ranks of the data-parallel group share E experts,
E/ep each), a dense parameter is replicated on all dp ranks and averaged over them, but an
expert is held by dp/ep ranks only, its replicas. Its owner computed the gradient from the
rows that all ep ranks routed to it, the sum of ep data-parallel shares; averaged over its
replicas and scaled by 1/ep, it is the average over dp that one device would take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...runtime.group import ProcessGroup


@dataclass(frozen=True)
class ExpertDataParallel:
    """Parameters held by one rank of an expert-parallel group (a mixture of experts'
    experts), reduced over their own replicas instead of the whole data-parallel group
    (Megatron-LM's expert_data_parallel_group):

        g_expert = scale · all_reduce(g, "avg", group)      scale = 1 / ep

    group:         the ranks holding the same experts: dp / ep of them
    expert_group:  the ranks holding the other experts (ep of them), over which the
                   experts' squares are summed in the gradient norm
    scale:         1/ep: an expert's owner computed its gradient from the tokens of all ep
                   ranks (a sum of ep data-parallel shares), so the average over its dp/ep
                   replicas is ep times the average over dp (Megatron-LM's
                   expert_gradient_scaling_factor)
    is_expert:     is_expert(parameter name) -> bool
    """

    group: ProcessGroup
    expert_group: ProcessGroup
    scale: float
    is_expert: Callable[[str], bool]
