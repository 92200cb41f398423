"""How fast a matrix multiplication runs: a fraction of the device's peak that grows with
the GEMM's size, one small function the user can recalibrate.

The formula is the runtime's (runtime/compute_model.py says why it has this shape):

    t = 2 M N K / (eff(M, N, K) · peak),   eff(M, N, K) = e_max · g(M) g(N) g(K),
    g(x) = x / (x + x_half)

the class (GemmEfficiency) and the fitted e_max live there, since the runtime's clock
charges GEMMs with them; this module fits e_max and names the calibration.

The calibration (A100_MEGATRON, used for the A100 preset): x_half = 128, the edge of the
A100's largest bf16 tensor-core tile in cuBLAS and CUTLASS (128 x 128 x 32), is fixed, not
fitted; e_max is the one number fitted, once, on one principle: it is the value at which
the mean signed error of minipar's step time over the eight iteration times of Korthikanti
et al. 2022, Table 5 (A100, Megatron-LM, dp = 1) is zero: e_max = 0.766 (calibrate_e_max's
bisection gives 0.7662), with the rest of the step on the DGX A100 preset's measured
figures, not fitted either (presets.py: NCCL's bus bandwidth of 230 GB/s on NVLink 3 and
24 GB/s a GPU on InfiniBand HDR, 1.80 TB/s of HBM for elementwise work; at the nominal
300 GB/s, 25 GB/s and 2.039 TB/s the same rule gave 0.743). Nothing is fitted per row;
Narayanan et al. 2021's Table 1, measured on the same machines with the 2021 Megatron-LM,
is predicted with the same number (tests/plan/test_step_time.py:
test_the_calibration_is_the_zero_mean_fit_over_table5, and docs/planner.md for every row's
error). For another device or code base fit e_max the same way (calibrate_e_max) on a set
of its measured steps, or set it from a GEMM benchmark.
"""

from __future__ import annotations

from typing import Callable, Sequence

# the formula and the fitted number are the runtime's, whose clock charges GEMMs with them
from ..runtime.compute_model import A100_E_MAX, TILE, GemmEfficiency


def calibrate_e_max(errors_at: Callable[[float], Sequence[float]], lo: float = 0.2,
                    hi: float = 1.0, tol: float = 1e-6) -> float:
    """The e_max at which the mean of errors_at(e_max) (signed relative errors of predicted
    against measured step times, (predicted - measured) / measured) is zero, by bisection:
    a larger e_max makes every GEMM faster, so the mean error falls as e_max grows."""
    def mean(e: float) -> float:
        errs = list(errors_at(e))
        return sum(errs) / len(errs)

    if mean(lo) < 0 or mean(hi) > 0:
        raise ValueError(f"the mean error does not change sign between e_max = {lo} and "
                         f"{hi}: no e_max in that range fits these measurements")
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


#: fitted once as the module docstring says; tests/plan/test_step_time.py checks the fit
A100_MEGATRON = GemmEfficiency(A100_E_MAX, TILE, "e_max: zero mean error over Korthikanti et "
                                            "al. 2022, Table 5; x_half: the A100 tile edge")

DEFAULTS = {"A100-SXM-80GB": A100_MEGATRON}


def default_gemm(device_name: str) -> GemmEfficiency:
    """The calibrated efficiency of a device, or the A100's for a device with none: its
    e_max is a property of the code base more than of the chip; recalibrate when you can."""
    return DEFAULTS.get(device_name, A100_MEGATRON)
