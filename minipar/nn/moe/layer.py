"""A mixture-of-experts MLP: router, dispatch, experts, combine (+ shared experts).

    x: [s, b, h] -> tokens [T, h], T = s·b
    w, experts = router(tokens)                              (router.py)        w: [T, k]
    plan       = which pairs each expert keeps (capacity)    (dispatch.py)
    ys         = experts(permute(tokens))                    (experts.py)       ys: [R, h]
    y          = unpermute(ys, w)  (+ shared(x))             y: [s, b, h]
    losses     = coeff · aux(probs, experts) + coeff_z · z(logits) (+ sequence-wise aux)

Megatron-LM's MoELayer with its token dispatcher reduced to one device (Shazeer et al. 2017;
GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021; DeepSeekMoE's shared
experts, Dai et al. 2024). It stands in a `Block`'s MLP slot: forward(x, rng) -> (y, saved),
backward(dy, saved, store=None, loss_scale=1.0) -> dx, parameters().

The balancing losses are part of the objective, not of the output: their values of the last
forward are in `aux_losses` (for logging, as Megatron logs load_balancing_loss), and their
gradients enter the router in the backward, multiplied by `loss_scale`, the weight the
model's loss has in the backward (1/m for m accumulated micro-batches: the main loss is
averaged over them and so must the auxiliary one be; Megatron's MoEAuxLossAutoScaler does
the same with a global scale). They are computed over the tokens of one forward: the
micro-batch of one rank. With `reduce_counts` (MoEConfig.global_aux_loss, set by the mesh)
the switch loss's f is the global batch's instead: the counts of every data-parallel rank's
micro-batch, summed, as one device routing them all would measure it.

No dropout inside: the layer draws nothing from `rng`.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..mlp import MLP
from ..module import Module
from ..saved import Saved
from ..weight_grads import WeightGradStore
from .balancing import (expert_counts, sequence_aux_loss, switch_aux_loss,
                        update_expert_bias, z_loss)
from .dispatch import (DROP_POLICIES, capacity, permute, permute_backward, plan_routing,
                       unpermute, unpermute_backward)
from .experts import Experts
from .router import TopKRouter, aux_probs, aux_probs_backward


class MoE(Module):
    """x [s, b, h] -> Σ_j w_j · expert_j(x) (+ shared experts), k of E experts a token."""

    parameter_order = ("router", "experts", "shared")
    takes_loss_scale = True  # Block passes the micro-batch loss's weight to backward

    def __init__(self, name: str, hidden: int, ffn_hidden: int, num_experts: int,
                 top_k: int = 2, *, score_function: str = "softmax", normalize: bool = True,
                 scaling_factor: float = 1.0, num_groups: int = 1,
                 topk_groups: Optional[int] = None, capacity_factor: Optional[float] = None,
                 drop_policy: str = "probs", pad_to_capacity: bool = False,
                 aux_loss_coeff: float = 0.0, seq_aux_loss_coeff: float = 0.0,
                 z_loss_coeff: float = 0.0, shared_ffn_hidden: int = 0, gelu: str = "tanh",
                 seed: int = 0, dtype=np.float64, std: float = 0.02, out_std: float = 0.02,
                 reduce_counts: Optional[Callable[[np.ndarray], np.ndarray]] = None):
        """ffn_hidden: each routed expert's width; shared_ffn_hidden: the width of the
        shared experts, run on every token (0: none; DeepSeek-V3's one shared expert has
        the routed width). capacity_factor None: dropless. reduce_counts: how the aux
        loss's choice counts [E] become the global batch's (the mesh's sum over the
        data-parallel ranks); None: this forward's own tokens."""
        if drop_policy not in DROP_POLICIES:
            raise ValueError(f"drop_policy must be one of {DROP_POLICIES}, got {drop_policy!r}")
        if pad_to_capacity and capacity_factor is None:
            raise ValueError("pad_to_capacity pads each expert's rows up to its capacity: "
                             "give a capacity_factor too")
        for what, c in (("aux_loss_coeff", aux_loss_coeff), ("z_loss_coeff", z_loss_coeff),
                        ("seq_aux_loss_coeff", seq_aux_loss_coeff)):
            if c < 0:
                raise ValueError(f"{what} is a loss's weight, >= 0; got {c}")
        if capacity_factor is not None:
            capacity(1, num_experts, top_k, capacity_factor)  # refuses a bad factor
        self.name, self.num_experts, self.top_k = name, num_experts, top_k
        self.capacity_factor, self.drop_policy = capacity_factor, drop_policy
        self.pad_to_capacity = pad_to_capacity
        self.aux_loss_coeff, self.seq_aux_loss_coeff = aux_loss_coeff, seq_aux_loss_coeff
        self.z_loss_coeff = z_loss_coeff
        self.reduce_counts = reduce_counts
        self.router = TopKRouter(f"{name}.router", hidden, num_experts, top_k,
                                 score_function, normalize, scaling_factor, num_groups,
                                 topk_groups, seed, dtype, std)
        self.experts = self.build_experts(f"{name}.experts", hidden, ffn_hidden, num_experts,
                                          gelu, seed, dtype, std, out_std)
        self.shared = (MLP(f"{name}.shared", hidden, shared_ffn_hidden, gelu, seed, dtype,
                           std, out_std) if shared_ffn_hidden else None)
        self.aux_losses: dict[str, float] = {}  # the last forward's balancing losses
        self.last_plan = None  # the last forward's RoutingPlan (counts, drops), to inspect

    def build_experts(self, name: str, hidden: int, ffn_hidden: int, num_experts: int,
                      gelu: str, seed: int, dtype, std: float, out_std: float) -> Experts:
        """All E experts here; an expert-parallel layer overrides it (parallel/ep)."""
        return Experts(name, hidden, ffn_hidden, num_experts, gelu, seed, dtype, std, out_std)

    def capacity_of(self, num_tokens: int) -> Optional[int]:
        """The pairs one expert keeps of `num_tokens` tokens (None: dropless)."""
        if self.capacity_factor is None:
            return None
        return capacity(num_tokens, self.num_experts, self.top_k, self.capacity_factor)

    def forward(self, x: np.ndarray, rng=None) -> tuple[np.ndarray, tuple]:
        """y [s, b, h] for x [s, b, h]; sets aux_losses and last_plan."""
        s, b, h = x.shape
        T = s * b
        tokens = x.reshape(T, h)  # tokens: [T, h]
        w, chosen, s_router = self.router.forward(tokens)  # w, chosen: [T, k]
        extra = self._balancing(s_router, chosen, s)
        plan = plan_routing(chosen, w, self.num_experts, self.capacity_of(T),
                            self.drop_policy, self.pad_to_capacity)
        xs = permute(tokens, plan)  # xs: [R, h]
        ys, s_experts = self.experts.forward(xs, plan.rows_per_expert)  # ys: [R, h]
        y, s_unperm = unpermute(ys, plan, w)  # y: [T, h]
        y = y.reshape(s, b, h)
        s_shared = None
        if self.shared is not None:
            y_shared, s_shared = self.shared.forward(x)  # y_shared: [s, b, h]
            y = y + y_shared
        self.last_plan = plan
        return y, (s_router, extra, plan, s_experts, s_unperm, s_shared)

    def _balancing(self, s_router, chosen: np.ndarray, seq_len: int) -> Saved:
        """The balancing losses' values (into aux_losses) and their gradients with respect
        to the router's scores and logits, for a loss weight of 1 (a Saved: on the ledger
        until the backward)."""
        sf = self.router.score_function
        self.aux_losses = {}
        dprobs = dlogits = None
        if self.aux_loss_coeff or self.seq_aux_loss_coeff:
            probs = aux_probs(s_router.scores, sf)  # probs: [T, E]
            dprobs = np.zeros_like(probs)
            if self.aux_loss_coeff:
                counts = None
                if self.reduce_counts is not None:  # the global batch's f
                    counts = self.reduce_counts(expert_counts(chosen, self.num_experts))
                loss, d = switch_aux_loss(probs, chosen, self.aux_loss_coeff, counts)
                self.aux_losses["load_balancing"] = loss
                dprobs += d
            if self.seq_aux_loss_coeff:
                loss, d = sequence_aux_loss(probs, chosen, seq_len, self.seq_aux_loss_coeff)
                self.aux_losses["seq_load_balancing"] = loss
                dprobs += d
        if self.z_loss_coeff:
            loss, dlogits = z_loss(s_router.logits, self.z_loss_coeff)
            self.aux_losses["z_loss"] = loss
        dscores = None if dprobs is None else aux_probs_backward(dprobs, s_router.scores, sf)
        return Saved(f"{self.name}.balancing", dscores=dscores, dlogits=dlogits)

    def backward(self, dy: np.ndarray, saved: tuple, store: Optional[WeightGradStore] = None,
                 loss_scale: float = 1.0) -> np.ndarray:
        """dx [s, b, h] from dy [s, b, h]; the balancing losses' gradients enter the router
        times loss_scale. With a store, the weights' gradients wait for its W."""
        s_router, extra, plan, s_experts, s_unperm, s_shared = saved
        s, b, h = dy.shape
        T = s * b
        dys, dw = unpermute_backward(dy.reshape(T, h), s_unperm, plan)  # dys: [R, h]
        dxs = self.experts.backward(dys, s_experts, store)  # dxs: [R, h]
        dx = permute_backward(dxs, plan, T)  # dx: [T, h]
        dscores = None if extra.dscores is None else extra.dscores * loss_scale
        dlogits = None if extra.dlogits is None else extra.dlogits * loss_scale
        extra.release()
        dx += self.router.backward(dw, s_router, dscores, dlogits, store)
        dx = dx.reshape(s, b, h)
        if self.shared is not None:
            dx += self.shared.backward(dy, s_shared, store)
        return dx

    def total_aux_loss(self) -> float:
        """Σ of the last forward's balancing losses (each already times its coefficient)."""
        return float(sum(self.aux_losses.values()))

    def __repr__(self) -> str:
        cap = ("dropless" if self.capacity_factor is None
               else f"capacity factor {self.capacity_factor:g} ({self.drop_policy})")
        shared = ", shared experts" if self.shared is not None else ""
        return f"MoE({self.name}, top {self.top_k} of {self.num_experts}, {cap}{shared})"


def moe_layer(name: str, cfg, layer_cls: type = MoE, **kwargs) -> MoE:
    """The MoE layer of a block named `name` of the GPT of `cfg` (cfg.moe set): the model's
    hidden size, dtype, seed and init (fc2 and the shared experts' fc2 at GPT-2's residual
    std, as the dense MLP's), and the MoEConfig's routing and balancing. `layer_cls` and
    `kwargs`: another layer with MoE's arguments (an expert-parallel one and its group)."""
    m = cfg.moe
    out_std = cfg.init_std / np.sqrt(2 * cfg.num_layers)  # block.residual_out_std
    return layer_cls(name, cfg.hidden, m.expert_ffn(cfg.ffn), m.num_experts, m.top_k,
               score_function=m.score_function, normalize=m.normalize,
               scaling_factor=m.scaling_factor, num_groups=m.num_groups,
               topk_groups=m.topk_groups, capacity_factor=m.capacity_factor,
               drop_policy=m.drop_policy, pad_to_capacity=m.pad_to_capacity,
               aux_loss_coeff=m.aux_loss_coeff, seq_aux_loss_coeff=m.seq_aux_loss_coeff,
               z_loss_coeff=m.z_loss_coeff, shared_ffn_hidden=m.shared_ffn_hidden,
               gelu=cfg.gelu, seed=cfg.seed, dtype=cfg.np_dtype, std=cfg.init_std,
               out_std=out_std, **kwargs)


def moe_layers(model) -> list[MoE]:
    """The MoE layers of a GPT's blocks (built here: a pipeline rank's own), in order."""
    return [blk.mlp for blk in model.blocks if isinstance(getattr(blk, "mlp", None), MoE)]


def aux_loss_of(model) -> float:
    """Σ over the model's MoE layers of their last forward's balancing losses: what the
    objective adds to the cross-entropy (each loss already times its coefficient)."""
    return float(sum(layer.total_aux_loss() for layer in moe_layers(model)))


def update_routers(model, rate: float) -> None:
    """Once per optimizer step: DeepSeek-V3's aux-loss-free balancing. Each router's bias
    moves by rate · sign(mean load − load) over the choices counted since the last step
    (balancing.update_expert_bias), and its counts start again. Data-parallel replicas
    must sum their counts first, so that their biases stay equal (parallel/mesh)."""
    for layer in moe_layers(model):
        r = layer.router
        if rate:
            r.expert_bias = update_expert_bias(r.expert_bias, r.tokens_per_expert, rate)
        r.reset_counts()
