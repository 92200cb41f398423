"""Expert-parallel mixture of experts: y = Σ_j w_j · expert_j(x), E experts over ep ranks.

    x_p: [s, b, h], rank p's own tokens (each ep rank its own micro-batch)
    w, experts = router(x_p)                replicated W_r [E, h]          w: [T, k]
    plan       = capacity, drops            on rank p's own T = s·b tokens
    xs         = permute(x_p)               rows by global expert          [R, h]
    rows_local = dispatch(xs)               all-to-all (backward: the all-to-all with
                                            the splits swapped)            [R_local, h]
    ys_local   = this rank's E/ep experts   one contiguous block each      [R_local, h]
    ys         = combine(ys_local)          all-to-all back (backward: the splits
                                            swapped)                       [R, h]
    y_p        = unpermute(ys, w) + shared(x_p)     (shared: replicated)   [s, b, h]

Megatron-LM's MoELayer with its `MoEAlltoAllTokenDispatcher` and expert parallelism
(GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021). The layer is nn's
`MoE` with one part changed: its experts are `ExpertParallelExperts`, nn's `Experts` built
with only this rank's experts (`expert_ids`, names `{name}.experts.{e}`, so the same
initial weights as on one device) and wrapped in the dispatch and combine of
dispatcher.py. Its forward and backward are `MoE`'s own, unchanged; so are the router,
the balancing losses and the shared experts, replicated on every rank with the names (and
initial values) of the single-device layer.

What each rank computes, and why:
- Capacity and drops are decided on each rank's own tokens before the exchange: rank p
  drops exactly the tokens the single-device layer run on x_p drops (as Megatron's
  router does, before its dispatcher; a capacity over the whole ep group would need the
  group's counts first).
- The balancing losses (aux_losses) are computed on the rank's own tokens: the values
  the single-device layer gives on x_p.
- Gradients. The router's and the shared experts' are rank p's tokens' share, as on one
  device on x_p: summing or averaging them over the ranks that replicate them (the ep
  ranks are data-parallel replicas for these weights) is the mesh's job. Expert e's
  owner computes dW from every rank's rows, so its gradient is the SUM over the ep group
  of each rank's share; how that is averaged over the expert's data-parallel replicas is
  the mesh's job, not this layer's.
- The router's tokens_per_expert counts this rank's choices; the aux-loss-free bias
  update wants them summed over the step's ranks (balancing.update_expert_bias).

pad_to_capacity: each rank pads every expert's rows to its capacity before the exchange,
so every all-to-all split is C rows an expert (static shapes, as Megatron's
moe_pad_expert_input_to_capacity); the padding rows are zeros, carry no gradient and are
dropped by the unpermute. With a `store`, the
expert weights' gradients wait for its W; the all-to-alls stay in I (the input
gradient's path): the other ranks' input gradients wait for them.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...nn.moe import Experts, MoE
from ...nn.weight_grads import WeightGradStore
from ...runtime.group import ProcessGroup
from .dispatcher import (combine, combine_backward, dispatch, dispatch_backward,
                         local_expert_indices, num_local_experts)


class ExpertParallelExperts(Experts):
    """xs [R, h] by global expert -> ys [R, h]: dispatch, this rank's E/ep MLPs, combine."""

    def __init__(self, name: str, hidden: int, ffn_hidden: int, num_experts: int,
                 group: ProcessGroup, gelu: str = "tanh", seed: int = 0, dtype=np.float64,
                 std: float = 0.02, out_std: float = 0.02):
        super().__init__(name, hidden, ffn_hidden, num_experts, gelu, seed, dtype, std,
                         out_std, expert_ids=local_expert_indices(num_experts, group))
        self.group = group

    def forward(self, xs: np.ndarray, rows_per_expert: np.ndarray) -> tuple[np.ndarray, tuple]:
        """ys [R, h] for xs [R, h] (rows_per_expert [E]: this rank's rows of every expert)."""
        rows, per_local, record = dispatch(xs, rows_per_expert, self.group,
                                           self.num_experts)  # rows: [R_local, h]
        ys_local, s_local = super().forward(rows, per_local)  # ys_local: [R_local, h]
        return combine(ys_local, record), (record, s_local)  # ys: [R, h]

    def backward(self, dys: np.ndarray, saved: tuple,
                 store: Optional[WeightGradStore] = None) -> np.ndarray:
        """dxs [R, h] from dys [R, h]: combine's backward, the local experts' backward
        (weight gradients from every rank's rows), dispatch's backward."""
        record, s_local = saved
        dys_local = combine_backward(dys, record)  # dys_local: [R_local, h]
        d_rows = super().backward(dys_local, s_local, store)  # d_rows: [R_local, h]
        return dispatch_backward(d_rows, record)  # dxs: [R, h]

    def __repr__(self) -> str:
        return (f"ExpertParallelExperts({self.name}, experts {self.expert_ids[0]}.."
                f"{self.expert_ids[-1]} of {self.num_experts} on {self.group})")


class ExpertParallelMoE(MoE):
    """x_p [s, b, h] -> Σ_j w_j · expert_j(x_p) (+ shared), the experts spread over `group`.

    The arguments of nn's MoE (keyword arguments passed on), plus `group`, the
    expert-parallel ProcessGroup (num_experts a multiple of its size); only the experts
    differ (`build_experts`). forward(x, rng) -> (y, saved), backward(dy, saved, store=None,
    loss_scale=1.0) -> dx, aux_losses, last_plan and parameters() are MoE's."""

    def __init__(self, name: str, hidden: int, ffn_hidden: int, num_experts: int,
                 top_k: int = 2, *, group: ProcessGroup, **kwargs):
        num_local_experts(num_experts, group)  # a ProcessGroup this rank is in, E % ep == 0
        self.group = group  # read by build_experts, which MoE.__init__ calls
        super().__init__(name, hidden, ffn_hidden, num_experts, top_k, **kwargs)

    def build_experts(self, name: str, hidden: int, ffn_hidden: int, num_experts: int,
                      gelu: str, seed: int, dtype, std: float, out_std: float
                      ) -> ExpertParallelExperts:
        """This rank's E/ep experts, behind the dispatcher (the router, the balancing
        losses and the shared experts are MoE's own, replicated)."""
        return ExpertParallelExperts(name, hidden, ffn_hidden, num_experts, self.group, gelu,
                                     seed, dtype, std, out_std)

    def __repr__(self) -> str:
        inner = super().__repr__()[len("MoE("):-1]  # MoE's description
        mine = self.experts.expert_ids
        return (f"ExpertParallelMoE({inner}, experts {mine[0]}..{mine[-1]} here, on "
                f"{self.group})")

