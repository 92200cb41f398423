"""Mixture of experts on one device: router, balancing losses, dispatch, experts, the layer.

    router.py     TopKRouter: scores (softmax | sigmoid), top-k (+ bias, groups), weights
    balancing.py  the auxiliary, sequence-wise and z losses; the aux-loss-free bias update
    dispatch.py   capacity, dropped pairs, permute / unpermute
    experts.py    Experts: E MLPs run on their blocks of rows
    layer.py      MoE: all of it in a Block's MLP slot; the model-level helpers
    config.py     MoEConfig: which blocks (GPTConfig.moe), with what routing and balancing

Each piece pairs its forward with its backward; read them in this order.
"""

from .balancing import (expert_counts, sequence_aux_loss, switch_aux_loss, update_expert_bias,
                        z_loss)
from .dispatch import RoutingPlan, capacity, permute, plan_routing, unpermute
from .config import MoEConfig
from .experts import Experts
from .layer import MoE, aux_loss_of, moe_layer, moe_layers, update_routers
from .router import TopKRouter

__all__ = ["TopKRouter", "MoE", "MoEConfig", "Experts", "moe_layer", "moe_layers",
           "aux_loss_of", "update_routers", "RoutingPlan", "capacity", "plan_routing",
           "permute", "unpermute", "expert_counts", "switch_aux_loss", "sequence_aux_loss",
           "z_loss", "update_expert_bias"]
