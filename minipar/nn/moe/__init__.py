"""Mixture of experts on one device: router, balancing losses, dispatch, experts, the layer.

    router.py     TopKRouter: scores (softmax | sigmoid), top-k (+ bias, groups), weights
    balancing.py  the auxiliary, sequence-wise and z losses; the aux-loss-free bias update
    dispatch.py   capacity, dropped pairs, permute / unpermute
    experts.py    Experts: E MLPs run on their blocks of rows
    layer.py      MoE: all of it in a Block's MLP slot

Each piece pairs its forward with its backward; read them in this order.
"""

from .balancing import (expert_counts, sequence_aux_loss, switch_aux_loss, update_expert_bias,
                        z_loss)
from .dispatch import RoutingPlan, capacity, permute, plan_routing, unpermute
from .experts import Experts
from .layer import MoE
from .router import TopKRouter

__all__ = ["TopKRouter", "MoE", "Experts", "RoutingPlan", "capacity", "plan_routing",
           "permute", "unpermute", "expert_counts", "switch_aux_loss", "sequence_aux_loss",
           "z_loss", "update_expert_bias"]
