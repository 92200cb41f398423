"""Analytical models: FLOPs, memory, time. They read numbers, never run a model."""

from .flops import model_flops, model_flops_full_recompute, selective_recompute_extra_flops
from .memory import activation_bytes_per_layer

__all__ = ["model_flops", "model_flops_full_recompute", "selective_recompute_extra_flops",
           "activation_bytes_per_layer"]
