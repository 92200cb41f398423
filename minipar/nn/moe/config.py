"""MoEConfig: which blocks hold a mixture of experts, and how it routes and balances.

    GPTConfig(..., moe=MoEConfig(num_experts=8, top_k=2, moe_every=2))

Block i is a mixture of experts when i >= first_dense and (i - first_dense) % moe_every
== 0 (Megatron-LM's moe_layer_freq; DeepSeek-V3 keeps its first 3 blocks dense:
first_dense = 3). The other blocks keep the dense MLP. The fields are MoE's arguments
(layer.py), with Megatron-LM's meaning; ffn_hidden None is the model's own ffn width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from .dispatch import DROP_POLICIES
from .router import check_routing


@dataclass(frozen=True)
class MoEConfig:
    """A mixture of experts in every moe_every-th block (see the module docstring)."""

    num_experts: int = 8
    top_k: int = 2
    moe_every: int = 1
    first_dense: int = 0
    ffn_hidden: Optional[int] = None  # each routed expert's width (None: the model's ffn)
    score_function: str = "softmax"  # "softmax" | "sigmoid" (DeepSeek-V3)
    normalize: bool = True  # the k weights of a token sum to 1 (times scaling_factor)
    scaling_factor: float = 1.0
    num_groups: int = 1  # group-limited routing: G groups of experts ...
    topk_groups: Optional[int] = None  # ... of which the best M are kept (None: all)
    capacity_factor: Optional[float] = None  # None: dropless
    drop_policy: str = "probs"  # "probs" | "position"
    pad_to_capacity: bool = False
    aux_loss_coeff: float = 0.0  # GShard / Switch load-balancing loss
    global_aux_loss: bool = False  # its f over all data-parallel ranks' tokens (the mesh)
    seq_aux_loss_coeff: float = 0.0  # DeepSeek-V3's sequence-wise balance loss
    z_loss_coeff: float = 0.0  # ST-MoE's router z-loss
    shared_ffn_hidden: int = 0  # shared experts' width (0: none)
    bias_update_rate: float = 0.0  # DeepSeek-V3's aux-loss-free balancing, gamma (0: off)

    def __post_init__(self):
        for name in ("num_experts", "top_k", "moe_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MoEConfig.{name} must be a positive int, got {v!r}")
        if isinstance(self.first_dense, bool) or not isinstance(self.first_dense, int) \
                or self.first_dense < 0:
            raise ValueError(f"MoEConfig.first_dense must be an int >= 0 (the dense blocks "
                             f"before the first MoE block), got {self.first_dense!r}")
        check_routing(self.num_experts, self.top_k, self.score_function, self.num_groups,
                      self.topk_groups)
        if self.ffn_hidden is not None and (not isinstance(self.ffn_hidden, int)
                                            or self.ffn_hidden < 1):
            raise ValueError(f"MoEConfig.ffn_hidden must be a positive int (None: the "
                             f"model's ffn width), got {self.ffn_hidden!r}")
        if self.capacity_factor is not None and not (
                isinstance(self.capacity_factor, (int, float))
                and math.isfinite(self.capacity_factor) and self.capacity_factor > 0):
            raise ValueError(f"MoEConfig.capacity_factor must be a positive number (None: "
                             f"dropless), got {self.capacity_factor!r}")
        if self.drop_policy not in DROP_POLICIES:
            raise ValueError(f"MoEConfig.drop_policy must be one of {DROP_POLICIES}, got "
                             f"{self.drop_policy!r}")
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError("MoEConfig.pad_to_capacity pads each expert's rows up to its "
                             "capacity: give a capacity_factor too")
        for name in ("aux_loss_coeff", "seq_aux_loss_coeff", "z_loss_coeff",
                     "bias_update_rate", "scaling_factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise ValueError(f"MoEConfig.{name} must be a finite number >= 0, got {v!r}")
        if not isinstance(self.global_aux_loss, bool):
            raise ValueError(f"MoEConfig.global_aux_loss must be True or False, got "
                             f"{self.global_aux_loss!r}")
        if self.global_aux_loss and not self.aux_loss_coeff:
            raise ValueError("MoEConfig.global_aux_loss measures the aux loss's f over the "
                             "global batch, but aux_loss_coeff is 0 (no aux loss): give "
                             "aux_loss_coeff > 0, or leave global_aux_loss False")
        if isinstance(self.shared_ffn_hidden, bool) or not isinstance(self.shared_ffn_hidden,
                                                                      int) \
                or self.shared_ffn_hidden < 0:
            raise ValueError(f"MoEConfig.shared_ffn_hidden must be an int >= 0 (0: no shared "
                             f"experts), got {self.shared_ffn_hidden!r}")

    def is_moe_block(self, index: int) -> bool:
        """Whether block `index` holds the mixture of experts (else the dense MLP)."""
        return index >= self.first_dense and (index - self.first_dense) % self.moe_every == 0

    def expert_ffn(self, model_ffn: int) -> int:
        return model_ffn if self.ffn_hidden is None else self.ffn_hidden

    def layer_parameters(self, hidden: int, model_ffn: int) -> tuple[int, int]:
        """(total, active) parameters of one MoE layer: the router (E·h), E experts of
        2·h·f + f + h each (two linears with biases), the shared experts; active counts the
        k experts a token runs, the router and the shared experts."""
        f = self.expert_ffn(model_ffn)
        expert = 2 * hidden * f + f + hidden
        shared = (2 * hidden * self.shared_ffn_hidden + self.shared_ffn_hidden + hidden
                  if self.shared_ffn_hidden else 0)
        router = self.num_experts * hidden
        return (router + self.num_experts * expert + shared,
                router + self.top_k * expert + shared)
