"""What the clock charges for work: t = FLOPs / (eff(M, N, K) · peak) for a GEMM, bytes / W
for elementwise work.

A GEMM C[M, N] = A[M, K] · B[K, N] performs 2·M·N·K FLOPs. Its time is

    t = 2 M N K / (eff(M, N, K) · peak)
    eff(M, N, K) = e_max · g(M) · g(N) · g(K),      g(x) = x / (x + x_half)

e_max is the fraction of peak the largest GEMMs reach in a training run (the kernel's
main loop, with everything a framework adds around it); g is the fall-off of a small
dimension: a tensor-core kernel works on tiles, so a dimension of x_half elements wastes
as much of each tile's pipeline (its prologue and epilogue, the partly filled last wave
of tiles) as it uses. g is 1/2 at x = x_half and tends to 1; eff is monotone (it never
falls when a dimension grows) and symmetric in M, N, K, so the two backward GEMMs of a
layer (dX = dY·Wᵀ is [M, K] over N; dW = Xᵀ·dY is [K, N] over M) run at the forward's
efficiency and the backward costs exactly twice the forward.

    dimension x    128    256    768    1536   2048   6144   12288
    g(x)           0.50   0.67   0.86   0.92   0.94   0.98   0.99      (x_half = 128)

Elementwise work (LayerNorm, GeLU, softmax, dropout and the residual add, the embedding,
the cross-entropy, the optimizer step) does a few FLOPs per byte and is bound by the
device's memory bandwidth W: it takes bytes / W, the bytes it reads and writes in HBM.

`ComputeModel` is the pair a device's clock charges with:

    ComputeModel.peak()               every matmul at peak (eff = 1), elementwise work free:
                                      the default of `launch` and `minipar.device`, so one
                                      device's simulated MFU is 100 % by construction
    ComputeModel.calibrated(device)   eff as above with the A100 calibration below, and
                                      elementwise work over the device's HBM bandwidth:
                                      the planner's model of a step (minipar.plan), and the
                                      default of `minipar train`

The calibration (CALIBRATED_GEMM): x_half = 128, the edge of the A100's largest bf16
tensor-core tile in cuBLAS and CUTLASS (128 x 128 x 32), is fixed, not fitted; e_max =
0.766 is the one number fitted, once, by the planner's rule (plan/gemm.py's calibrate_e_max;
tests/plan/test_step_time.py checks it): the value at which the mean signed error of the
planner's step time over the eight iteration times of Korthikanti et al. 2022, Table 5
(A100, Megatron-LM, on the DGX A100 preset's measured links and HBM) is zero. It stands for an
H100 or H200 too until one of their measured runs is fitted (`GemmEfficiency.with_e_max`):
e_max is a property of the code base more than of the chip.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence

TILE = 128  # the A100's largest bf16 tensor-core tile edge (cuBLAS/CUTLASS 128 x 128 x 32)
A100_E_MAX = 0.766  # fitted by plan/gemm.py's rule (A100_MEGATRON) on Korthikanti et al.'s Table 5


@dataclass(frozen=True)
class GemmEfficiency:
    """eff(M, N, K) = e_max · g(M) g(N) g(K), g(x) = x / (x + x_half) (module docstring)."""

    e_max: float
    x_half: float = TILE
    source: str = ""

    def __post_init__(self):
        if not 0 < self.e_max <= 1:
            raise ValueError(f"GemmEfficiency.e_max is a fraction of peak in (0, 1], got "
                             f"{self.e_max!r}")
        if self.x_half < 0:
            raise ValueError(f"GemmEfficiency.x_half is a size >= 0, got {self.x_half!r}")

    def g(self, x: float) -> float:
        """x / (x + x_half): one dimension's share of the tile pipeline doing work."""
        return x / (x + self.x_half)

    def __call__(self, M: float, N: float, K: float) -> float:
        """The fraction of peak a GEMM of [M, K] x [K, N] reaches."""
        if min(M, N, K) <= 0:
            raise ValueError(f"a GEMM's dimensions are positive, got M={M}, N={N}, K={K}")
        return self.e_max * self.g(M) * self.g(N) * self.g(K)

    def seconds(self, M: float, N: float, K: float, peak: float, count: float = 1) -> float:
        """count GEMMs of [M, K] x [K, N]: 2 M N K count / (eff · peak)."""
        return 2 * M * N * K * count / (self(M, N, K) * peak)

    def with_e_max(self, e_max: float) -> "GemmEfficiency":
        return GemmEfficiency(e_max, self.x_half, self.source)


#: the planner's A100 calibration (module docstring), copied here so the runtime needs no plan
CALIBRATED_GEMM = GemmEfficiency(A100_E_MAX, TILE, "e_max: zero mean error over Korthikanti "
                                                   "et al. 2022, Table 5; x_half: the A100 "
                                                   "tile edge")


@dataclass(frozen=True)
class ComputeModel:
    """t = FLOPs / (eff(M, N, K) · peak) per GEMM and bytes / W per elementwise op.

    gemm:             the GEMM efficiency; None: every matmul at peak (eff = 1)
    memory_bandwidth: W in bytes/s (HBM); None: elementwise work costs nothing and the
                      clock records nothing for it
    """

    gemm: Optional[GemmEfficiency] = None
    memory_bandwidth: Optional[float] = None

    def __post_init__(self):
        if self.gemm is not None and not isinstance(self.gemm, GemmEfficiency):
            raise TypeError(f"ComputeModel.gemm is a GemmEfficiency (or None: every matmul "
                            f"at peak), got {type(self.gemm).__name__} {self.gemm!r}")
        w = self.memory_bandwidth
        if w is not None and (isinstance(w, bool) or not isinstance(w, numbers.Real)
                              or not math.isfinite(w) or w <= 0):
            raise ValueError(f"ComputeModel.memory_bandwidth is the HBM bandwidth in bytes/s, "
                             f"a finite number > 0 (e.g. 3.35e12 for an H100), or None "
                             f"(elementwise work free); got {w!r}")

    # ---- the two models ----------------------------------------------------------------
    @staticmethod
    def peak() -> "ComputeModel":
        """Every matmul at the device's peak, nothing else on the clock (the default)."""
        return PEAK

    @staticmethod
    def calibrated(device) -> "ComputeModel":
        """The planner's model on `device` (a DeviceSpec): GEMMs at CALIBRATED_GEMM's
        efficiency, elementwise work over device.memory_bandwidth."""
        w = getattr(device, "memory_bandwidth", None)
        if w is None:
            raise ValueError(
                f"ComputeModel.calibrated needs the device's HBM bandwidth, and "
                f"{getattr(device, 'name', device)!r} has memory_bandwidth=None: give the "
                f"DeviceSpec memory_bandwidth=<bytes/s> (the presets have it), or build "
                f"ComputeModel(gemm=CALIBRATED_GEMM, memory_bandwidth=<bytes/s>)")
        return ComputeModel(CALIBRATED_GEMM, w)

    @property
    def is_peak(self) -> bool:
        return self.gemm is None and self.memory_bandwidth is None

    # ---- what the clock asks ------------------------------------------------------------
    def matmul_seconds(self, flops: float, dims: Optional[Sequence[float]],
                       peak: float) -> float:
        """flops / (eff(M, N, K) · peak), dims = (M, N, K) of one GEMM (for a batched matmul,
        of one of its matrices: the efficiency is one matrix's). flops is what the work
        costs at peak: 2 M N K · count, or less for a kernel that skips masked entries.
        Without a shape (dims None) the work runs at e_max, the limit of a large GEMM."""
        if self.gemm is None:
            return flops / peak
        if flops == 0:
            return 0.0
        if dims is None:
            return flops / (self.gemm.e_max * peak)
        if len(dims) != 3:
            raise ValueError(f"matmul_seconds: dims are (M, N, K) of one GEMM, 3 numbers; "
                             f"got {tuple(dims)!r}")
        return flops / (self.gemm(*dims) * peak)

    def elementwise_seconds(self, nbytes: float) -> float:
        """nbytes / W: memory-bound work moving nbytes through HBM (0 without a bandwidth)."""
        if self.memory_bandwidth is None:
            return 0.0
        if nbytes < 0:
            raise ValueError(f"elementwise work moves bytes >= 0, got {nbytes!r}")
        return nbytes / self.memory_bandwidth

    def describe(self) -> str:
        """One line for a report: what a matmul and elementwise work cost on this clock."""
        if self.gemm is None:
            gemm = "every matmul at peak"
        else:
            gemm = (f"GEMM efficiency e_max {self.gemm.e_max:g} · g(M)g(N)g(K), "
                    f"g(x) = x/(x + {self.gemm.x_half:g})")
        if self.memory_bandwidth is None:
            return f"{gemm}, elementwise free"
        return f"{gemm}, elementwise over {self.memory_bandwidth / 1e12:g} TB/s HBM"


PEAK = ComputeModel()
