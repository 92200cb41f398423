"""Megatron tensor and sequence parallelism (Shoeybi et al. 2019; Korthikanti et al. 2022).
Read in this order (docs/tensor_parallel.md):

    mappings.py   f, g and the other conjugate forward/backward pairs
    layers.py     ColumnParallelLinear, RowParallelLinear; shards of the full init
    vocab.py      VocabParallelEmbedding, vocab_parallel_cross_entropy
    sequence.py   sequence-parallel LayerNorm and the gradients it leaves partial
    random.py     dropout masks: replicated, sharded, equal to one device's
    block.py      ParallelAttention, ParallelMLP, ParallelTransformerLayer
    gpt.py        TensorParallelGPT: GPT's skeleton with these parts

Only the tensor-parallel group is known here; where this rank's tokens sit in the global
batch (a data-parallel question) is passed in by parallel/mesh.
"""

from .block import (LOCAL_CORE, AttentionCore, ParallelAttention, ParallelMLP,
                    ParallelTransformerLayer)
from .gpt import TensorParallelGPT, check_tensor_parallel
from .layers import ColumnParallelLinear, RowParallelLinear, gather_parameter
from .mappings import (copy_to_tensor_model_parallel_region,
                       gather_from_sequence_parallel_region,
                       gather_from_tensor_model_parallel_region,
                       reduce_from_tensor_model_parallel_region,
                       reduce_scatter_to_sequence_parallel_region,
                       scatter_to_sequence_parallel_region,
                       scatter_to_tensor_model_parallel_region)
from .random import SlicedDraw, TensorParallelRNG
from .sequence import SequenceParallelGrads, SequenceParallelLayerNorm
from .vocab import (VocabParallelEmbedding, padded_vocab_size, vocab_parallel_cross_entropy,
                    vocab_parallel_cross_entropy_backward)

__all__ = ["copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "scatter_to_tensor_model_parallel_region", "gather_from_tensor_model_parallel_region",
           "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
           "reduce_scatter_to_sequence_parallel_region", "SlicedDraw", "TensorParallelRNG",
           "SequenceParallelGrads", "SequenceParallelLayerNorm", "ColumnParallelLinear",
           "RowParallelLinear", "gather_parameter", "AttentionCore", "LOCAL_CORE",
           "ParallelAttention", "ParallelMLP",
           "ParallelTransformerLayer", "TensorParallelGPT", "check_tensor_parallel",
           "VocabParallelEmbedding", "padded_vocab_size", "vocab_parallel_cross_entropy",
           "vocab_parallel_cross_entropy_backward"]
