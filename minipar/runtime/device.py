"""What one accelerator can do: peak FLOP/s per dtype, memory capacity and HBM bandwidth.

Presets use the vendors' published *dense* peak figures (no 2:4 sparsity) for the SXM
parts, and the capacity as marketed in decimal gigabytes (1 GB = 10**9 bytes), the unit
the memory formulas in the course are written in. Float64 and float32 matmuls count at
the tensor-core FP64 / TF32 rates, since that is what the libraries use by default on
these parts; the plain CUDA-core rates are kept as "fp32_simt" for reference. The memory
bandwidth is the HBM's, in bytes/s (A100 80GB 2.039 TB/s, H100 SXM 3.35 TB/s, H200 4.8
TB/s): what elementwise work runs at under a calibrated compute model (compute_model.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping, Optional

import numpy as np

from .checks import positive, whole

GB = 10**9
TFLOPS = 10**12


def dtype_key(dtype) -> str:
    """Name used to look up a peak rate: 'float64', 'float32', 'bfloat16', 'float16', ..."""
    if isinstance(dtype, str):
        return dtype
    return _name(np.dtype(dtype))


@functools.lru_cache(maxsize=None)
def _name(dtype: np.dtype) -> str:
    """`dtype.name`, remembered: NumPy builds the name in Python at every access, and a
    step at thousands of simulated ranks asks for it (a matmul: twice) a million times."""
    return dtype.name


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator: `peak_flops[dtype]` in FLOP/s, `memory_bytes` of capacity and
    `memory_bandwidth` in bytes/s (HBM; None: not known, elementwise work cannot be timed)."""

    name: str
    peak_flops: Mapping[str, float] = field(repr=False)
    memory_bytes: int
    memory_bandwidth: Optional[float] = None

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"a DeviceSpec's name is a string, got {self.name!r}")
        if not isinstance(self.peak_flops, Mapping) or not self.peak_flops:
            raise TypeError(f"DeviceSpec {self.name!r}: peak_flops maps dtype names to FLOP/s, "
                            f"e.g. {{'float32': 494e12}}, got {self.peak_flops!r}")
        for key, rate in self.peak_flops.items():
            positive(rate, f"DeviceSpec {self.name!r}: peak_flops[{key!r}] (FLOP/s)")
        object.__setattr__(self, "memory_bytes", whole(
            self.memory_bytes, f"DeviceSpec {self.name!r}: memory_bytes (its capacity)"))
        if self.memory_bandwidth is not None:
            object.__setattr__(self, "memory_bandwidth", positive(
                self.memory_bandwidth, f"DeviceSpec {self.name!r}: memory_bandwidth (HBM "
                                       f"bytes/s)"))

    def peak(self, dtype) -> float:
        """Peak FLOP/s for `dtype`; a clear error for a dtype the spec does not list."""
        key = dtype_key(dtype)
        if key not in self.peak_flops:
            raise KeyError(
                f"device {self.name} has no peak rate for dtype {key!r}; "
                f"it knows {sorted(self.peak_flops)}"
            )
        return self.peak_flops[key]

    def with_memory(self, memory_bytes: int) -> "DeviceSpec":
        """The same device with a different capacity (to provoke or avoid an OOM)."""
        return DeviceSpec(self.name, self.peak_flops, memory_bytes,  # checked: whole, >= 1
                          self.memory_bandwidth)

    # ---- presets -------------------------------------------------------------------
    @staticmethod
    def a100_80gb() -> "DeviceSpec":
        """NVIDIA A100 SXM 80GB: 312 TFLOP/s bf16/fp16, 156 TF32, 19.5 FP64 tensor core;
        HBM2e at 2.039 TB/s."""
        return DeviceSpec("A100-SXM-80GB", {
            "bfloat16": 312 * TFLOPS, "float16": 312 * TFLOPS,
            "float32": 156 * TFLOPS, "fp32_simt": 19.5 * TFLOPS,
            "float64": 19.5 * TFLOPS, "int8": 624 * TFLOPS,
        }, 80 * GB, 2039 * GB)

    @staticmethod
    def h100_sxm() -> "DeviceSpec":
        """NVIDIA H100 SXM5 80GB: 989 TFLOP/s bf16/fp16, 1979 fp8, 494 TF32, 67 FP64 TC;
        HBM3 at 3.35 TB/s."""
        return DeviceSpec("H100-SXM-80GB", {
            "bfloat16": 989 * TFLOPS, "float16": 989 * TFLOPS, "float8_e4m3fn": 1979 * TFLOPS,
            "float32": 494 * TFLOPS, "fp32_simt": 67 * TFLOPS,
            "float64": 67 * TFLOPS, "int8": 1979 * TFLOPS,
        }, 80 * GB, 3350 * GB)

    @staticmethod
    def h200() -> "DeviceSpec":
        """NVIDIA H200 SXM 141GB: the H100's compute with 141 GB of HBM3e at 4.8 TB/s."""
        h100 = DeviceSpec.h100_sxm()
        return DeviceSpec("H200-SXM-141GB", h100.peak_flops, 141 * GB, 4800 * GB)

    @staticmethod
    def preset(name: str) -> "DeviceSpec":
        """Look a preset up by a short name: 'a100', 'h100', 'h200'."""
        table = {"a100": DeviceSpec.a100_80gb, "h100": DeviceSpec.h100_sxm,
                 "h200": DeviceSpec.h200}
        key = name.lower().replace("-", "").replace("_", "")[:4]
        if key not in table:
            raise ValueError(f"unknown device preset {name!r}: expected one of {sorted(table)}")
        return table[key]()
