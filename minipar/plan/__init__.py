"""Analytical models: FLOPs, memory, time, and the planner's search. They read numbers and
plain data (schedules, the cost model), never run a model."""

from .flops import (model_flops, model_flops_full_recompute, moe_model_flops,
                    selective_recompute_extra_flops)
from .gemm import A100_MEGATRON, GemmEfficiency, calibrate_e_max
from .layout import Layout
from .memory import (activation_bytes_per_layer, best_segment, segment_sizes,
                     segments_activation_bytes, sqrt_rule)
from .moe import DEEPSEEK_V3, MLAConfig, MoETransformer
from .pipeline_time import analytic_bubble, pipeline_dry_run
from .presets import CLUSTERS, MODELS, ClusterSpec, ModelSpec
from .rank_memory import RankMemory, layer_activation_bytes, rank_memory
from .rank_states import Term, rank_parameters
from .search import Plan, search
from .stage_time import Overlap
from .step_time import StepTime, step_time
from .zero import (STAGE_NAMES, dp_comm_elements, flat_padding, format_memory_report,
                   memory_report, model_state_bytes, zero_figure1)

__all__ = ["model_flops", "model_flops_full_recompute", "selective_recompute_extra_flops",
           "moe_model_flops", "MoETransformer", "MLAConfig", "DEEPSEEK_V3",
           "activation_bytes_per_layer", "segment_sizes", "segments_activation_bytes",
           "best_segment", "sqrt_rule", "STAGE_NAMES", "model_state_bytes",
           "dp_comm_elements", "flat_padding", "zero_figure1", "memory_report",
           "format_memory_report", "Layout", "ModelSpec", "ClusterSpec", "MODELS", "CLUSTERS",
           "RankMemory", "Term", "rank_memory", "rank_parameters", "layer_activation_bytes",
           "step_time", "StepTime", "Overlap", "GemmEfficiency", "A100_MEGATRON",
           "calibrate_e_max", "pipeline_dry_run", "analytic_bubble", "Plan", "search"]
