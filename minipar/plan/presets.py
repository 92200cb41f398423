"""Models and clusters the planner knows by name, from their published configurations.

    MODELS["llama3-70b"].parameters()      70,553,706,496
    CLUSTERS["h100"].topology(nodes=64)    64 nodes of 8 H100 on NVLink 4, IB NDR between

A ModelSpec is a decoder-only transformer as its paper or released configuration gives it:
layers, hidden size, heads (and key-value heads: grouped-query attention), the MLP's width
and kind (GeLU's two matrices, or SwiGLU's three), the vocabulary, the training sequence
length, biases and norms, learned or rotary positions, tied or untied embeddings, and for a
mixture of experts the experts, top-k, their width and the shared ones. The counts are
exact for that architecture:

    attention   h·(a·d) [q] + 2·h·(a_kv·d) [k, v] + (a·d)·h [o]    (+ biases)
    MLP         2·h·f (GeLU) or 3·h·f (SwiGLU)                      (+ biases)
    MoE         E·h [router] + E·MLP(f_e) + S·MLP(f_e) [shared]      (k of E active)
    norms       2 per layer and 1 at the end, h each (LayerNorm: + its bias)
    ends        V·h [embedding] (+ V·h untied head) (+ s·h learned positions)

(DeepSeek-V3's latent attention is plan.moe.DEEPSEEK_V3, counted there.) A ClusterSpec is a
node kind: its device (runtime.device), devices per node, the link inside a node and the
link between nodes (runtime.topology), and the device's memory bandwidth (what elementwise
work is bound by).

A ClusterSpec's links are what the planner charges collectives at, so where a measurement
of what NCCL reaches on them is published, they carry it rather than the wire's nominal
rate (`achieved`; runtime.topology's presets stay nominal). Likewise elementwise work is
charged at the HBM bandwidth a streaming kernel reaches (`achieved_memory_bandwidth`),
where one is measured; `memory_bandwidth` stays the data sheet's (runtime.DeviceSpec's).
The A100 (DGX A100, the node the planner is validated on: docs/planner.md) has all three:

    NVLink 3     300 GB/s nominal a direction; nccl-tests' bus bandwidth reaches ~230 GB/s.
                 NVIDIA's NCCL maintainer (nccl-tests issue 149, "Expected bandwidth
                 results? A100 GPUs over NVLink", 2023): 12 NVLinks of 25 GB/s a direction
                 carry ~20 GB/s each in NCCL's 128-byte SM payloads, 240 GB/s, "but some
                 other bottlenecks on the GPUs limits it to ~230GB/s".
    IB HDR       25 GB/s a GPU nominal; NVIDIA measures 192 GB/s all-reduce bus bandwidth
                 on a DGX A100 with its eight 200 Gb/s NICs, 24 GB/s a GPU (NCCL issue 812,
                 "Why Tree has better bandwidth performance than Ring on only 2 DGX-A100?",
                 2023; and issue 412: "~24GB/s inter-node" for one HDR NIC).
    HBM2e        2.039 TB/s on the data sheet; a streaming read kernel reaches 1.80 TB/s,
                 88 % of it, by Nsight Compute (NVIDIA Developer Forums, "Trouble to Reach
                 Peak Bandwidth of A100", citing a GTC talk in which the best kernel
                 reached ~90 %).

The H100, H200 and H800 presets keep the nominal figures: their NVLink all-reduce runs on
NVLink SHARP, whose bus bandwidth (~480 GB/s on H100 by NCCL's maintainers, nccl-tests
issue 212) is above the wire's 450 GB/s while the ring collectives reach ~370 GB/s, and
one alpha-beta link cannot be both; no HBM measurement is used for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..runtime.device import GB, DeviceSpec
from ..runtime.topology import Link, Topology
from .moe import DEEPSEEK_V3


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's published shape (module docstring); `source` cites it."""

    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq_len: int
    kv_heads: Optional[int] = None  # None: as many as heads (multi-head attention)
    swiglu: bool = False  # three matrices of width ffn (gate, up, down), else GeLU's two
    biases: bool = True  # linear biases (GPT-2, Megatron's GPT), none in Llama / Mixtral
    layernorm: bool = True  # LayerNorm (gain and bias), else RMSNorm (gain only)
    learned_positions: bool = True  # a position table of s·h, else rotary (no weights)
    tied: bool = False  # the head's weight is the embedding's
    experts: int = 0  # routed experts in every layer (0: dense)
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    source: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    def _mlp(self, f: int) -> int:
        h, b = self.hidden, self.biases
        return (3 if self.swiglu else 2) * h * f + ((2 if self.swiglu else 1) * f + h if b
                                                    else 0)

    def attention_parameters(self) -> int:
        h, d = self.hidden, self.head_dim
        q, kv = self.heads * d, self.kv * d
        return h * q + 2 * h * kv + q * h + ((q + 2 * kv + h) if self.biases else 0)

    def mlp_parameters(self, active: bool = False) -> int:
        """One layer's MLP: dense, or the router, E (k if active) experts and the shared."""
        if not self.experts:
            return self._mlp(self.ffn)
        routed = self.top_k if active else self.experts
        return (self.experts * self.hidden + routed * self._mlp(self.expert_ffn)
                + self.shared_experts * self._mlp(self.expert_ffn))

    def layer_parameters(self, active: bool = False) -> int:
        norms = 2 * self.hidden * (2 if self.layernorm else 1)
        return self.attention_parameters() + self.mlp_parameters(active) + norms

    def parameters(self, active: bool = False) -> int:
        """Every weight (active: what one token runs through, k experts a layer)."""
        h = self.hidden
        ends = self.vocab * h * (1 if self.tied else 2) + (self.seq_len * h
                                                           if self.learned_positions else 0)
        final = h * (2 if self.layernorm else 1)
        return ends + final + self.layers * self.layer_parameters(active)

    def transformer_parameters(self) -> int:
        """The layers alone, 12·l·h² for a GPT with a 4h MLP: what Korthikanti et al.'s
        Figure 1 and Narayanan et al.'s per-rank figures count."""
        return self.layers * self.layer_parameters()


def _gpt(name, layers, hidden, heads, source, seq_len=2048, vocab=51200) -> ModelSpec:
    """Megatron's GPT: GeLU MLP of 4h, biases, LayerNorm, learned positions, untied."""
    return ModelSpec(name, layers, hidden, heads, 4 * hidden, vocab, seq_len, source=source)


_KORTHIKANTI = "Korthikanti et al. 2022, Table 3"
_SC21 = "Narayanan et al. 2021 (SC'21), Table 1"
_LLAMA3 = "Dubey et al. 2024, the Llama 3 Herd of Models, Table 3"
MODELS: dict[str, object] = {
    "22b": _gpt("22B", 48, 6144, 64, _KORTHIKANTI),
    "175b": _gpt("175B (GPT-3)", 96, 12288, 96, _KORTHIKANTI),
    "530b": _gpt("530B (MT-NLG)", 105, 20480, 128, _KORTHIKANTI),
    "1t": _gpt("1T", 128, 25600, 160, _KORTHIKANTI),
    "gpt3-175b": _gpt("GPT-3 175B", 96, 12288, 96, "Brown et al. 2020, Table 2.1"),
    "llama2-7b": ModelSpec("Llama 2 7B", 32, 4096, 32, 11008, 32000, 4096, swiglu=True,
                           biases=False, layernorm=False, learned_positions=False,
                           source="Touvron et al. 2023, Llama 2, Table 1 and its release"),
    "llama3-8b": ModelSpec("Llama 3 8B", 32, 4096, 32, 14336, 128256, 8192, kv_heads=8,
                           swiglu=True, biases=False, layernorm=False,
                           learned_positions=False, source=_LLAMA3),
    "llama3-70b": ModelSpec("Llama 3 70B", 80, 8192, 64, 28672, 128256, 8192, kv_heads=8,
                            swiglu=True, biases=False, layernorm=False,
                            learned_positions=False, source=_LLAMA3),
    "llama3-405b": ModelSpec("Llama 3 405B", 126, 16384, 128, 53248, 128256, 8192,
                             kv_heads=8, swiglu=True, biases=False, layernorm=False,
                             learned_positions=False, source=_LLAMA3),
    "mixtral-8x7b": ModelSpec("Mixtral 8x7B", 32, 4096, 32, 14336, 32000, 32768, kv_heads=8,
                              swiglu=True, biases=False, layernorm=False,
                              learned_positions=False, experts=8, top_k=2,
                              expert_ffn=14336, source="Jiang et al. 2024, Table 1"),
    "deepseek-v3": DEEPSEEK_V3,
}
#: SC'21's weak-scaling rows (Table 1): hidden, layers, heads, by parameter count
for _p, _h, _l, _a in (("1.7b", 2304, 24, 24), ("3.6b", 3072, 30, 32), ("7.5b", 4096, 36, 32),
                       ("18.4b", 6144, 40, 48), ("39.1b", 8192, 48, 64),
                       ("76.1b", 10240, 60, 80), ("145.6b", 12288, 80, 96),
                       ("310.1b", 16384, 96, 128), ("529.6b", 20480, 105, 128),
                       ("1008b", 25600, 128, 160)):
    MODELS[f"sc21-{_p}"] = _gpt(f"SC'21 {_p.upper()}", _l, _h, _a, _SC21)


@dataclass(frozen=True)
class ClusterSpec:
    """A kind of node: its device, how many a node, and the links inside and between (as
    NCCL drives them where that is measured: module docstring)."""

    name: str
    device: DeviceSpec
    gpus_per_node: int
    intra: Link
    inter: Link
    memory_bandwidth: float  # the device's HBM on its data sheet, bytes/s
    achieved_memory_bandwidth: Optional[float] = None  # what a streaming kernel reaches

    def __post_init__(self):
        w = self.achieved_memory_bandwidth
        if w is not None and not 0 < w <= self.memory_bandwidth:
            raise ValueError(f"ClusterSpec {self.name!r}: achieved_memory_bandwidth is in "
                             f"(0, memory_bandwidth = {self.memory_bandwidth:g}] bytes/s, "
                             f"got {w!r}")

    @property
    def elementwise_bandwidth(self) -> float:
        """Bytes/s elementwise work moves through HBM at: the measured figure, else the
        data sheet's."""
        return self.achieved_memory_bandwidth or self.memory_bandwidth

    def topology(self, nodes: int) -> Topology:
        return Topology(nodes, self.gpus_per_node, self.device, self.intra, self.inter)


def achieved(link: Link, busbw: float) -> Link:
    """`link` at the bus bandwidth NCCL reaches on it (nccl-tests' busbw, bytes/s a GPU and
    direction, the quantity runtime.cost's alpha-beta formulas take), its latency kept."""
    if not 0 < busbw <= link.bandwidth:
        raise ValueError(f"achieved({link.name}): NCCL's bus bandwidth is in (0, "
                         f"{link.bandwidth:g}] bytes/s, the link's nominal, got {busbw!r}")
    return Link(link.name, busbw, link.latency)


def _h800() -> DeviceSpec:
    """H800 SXM: the H100's compute and memory, its NVLink cut to 400 GB/s."""
    return DeviceSpec("H800-SXM-80GB", DeviceSpec.h100_sxm().peak_flops, 80 * GB)


CLUSTERS = {
    # NCCL's measured bus bandwidths and a streaming kernel's HBM (module docstring)
    "a100": ClusterSpec("DGX A100", DeviceSpec.a100_80gb(), 8,
                        achieved(Link.nvlink3(), 230 * GB),
                        achieved(Link.infiniband_hdr(), 24 * GB), 2039 * GB, 1800 * GB),
    "h100": ClusterSpec("DGX H100", DeviceSpec.h100_sxm(), 8, Link.nvlink4(),
                        Link.infiniband_ndr(), 3350 * GB),
    "h200": ClusterSpec("HGX H200", DeviceSpec.h200(), 8, Link.nvlink4(),
                        Link.infiniband_ndr(), 4800 * GB),
    "h800": ClusterSpec("HGX H800", _h800(), 8, Link("NVLink-H800", 200 * GB, 1e-6),
                        Link.infiniband_ndr(), 3350 * GB),
}


def model(name: str):
    """A preset by name (case and separators ignored), or a ValueError listing them."""
    key = name.lower().replace("_", "-").replace(" ", "")
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}: expected one of {sorted(MODELS)}")
    return MODELS[key]


def cluster(name: str) -> ClusterSpec:
    key = name.lower().replace("-", "").replace("_", "")
    if key not in CLUSTERS:
        raise ValueError(f"unknown cluster {name!r}: expected one of {sorted(CLUSTERS)}")
    return CLUSTERS[key]


__all__ = ["ModelSpec", "ClusterSpec", "MODELS", "CLUSTERS", "achieved", "model",
           "cluster"]
