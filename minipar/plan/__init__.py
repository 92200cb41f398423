"""Analytical models: FLOPs, memory, time. They read numbers, never run a model."""

from .flops import (model_flops, model_flops_full_recompute, moe_model_flops,
                    selective_recompute_extra_flops)
from .memory import (activation_bytes_per_layer, best_segment, segment_sizes,
                     segments_activation_bytes, sqrt_rule)
from .moe import DEEPSEEK_V3, MLAConfig, MoETransformer
from .zero import (STAGE_NAMES, dp_comm_elements, flat_padding, format_memory_report,
                   memory_report, model_state_bytes, zero_figure1)

__all__ = ["model_flops", "model_flops_full_recompute", "selective_recompute_extra_flops",
           "moe_model_flops", "MoETransformer", "MLAConfig", "DEEPSEEK_V3",
           "activation_bytes_per_layer", "segment_sizes", "segments_activation_bytes",
           "best_segment", "sqrt_rule", "STAGE_NAMES", "model_state_bytes",
           "dp_comm_elements", "flat_padding", "zero_figure1", "memory_report",
           "format_memory_report"]

# one rank's memory by category, for the planner (rank_memory.py, rank_states.py)
from .rank_memory import RankMemory, layer_activation_bytes, rank_memory  # noqa: E402
from .rank_states import Term, rank_parameters  # noqa: E402

__all__ += ["RankMemory", "Term", "rank_memory", "rank_parameters", "layer_activation_bytes"]
