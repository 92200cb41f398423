"""Parallel training forms, composed from the runtime, the model and the optimizers.

Data parallelism (this package so far):

    flat.py               FlatParameter: a unit's parameters in one padded 1-D buffer, N shards
    sharded_optimizer.py  Adam/AdamW on the elements a rank owns (float32 masters, m, v)
    engine.py             what every engine shares: no_sync, step with global-norm clipping,
                          full_state_dict / load_full_state_dict
    ddp.py                DistributedDataParallel: bucketed, overlapped all-reduce (stage 0)
    zero.py               ZeRO-1 and ZeRO-2; `zero_engine(model, stage=0..3)`
    zero3.py              ZeRO-3: parameters gathered around each use, prefetch, limits
    fsdp.py               FullyShardedDataParallel and ShardingStrategy over the above
    checkpoint.py         sharded and consolidated checkpoints of any engine; load reshards

Tensor and sequence parallelism (Megatron-LM; docs/tensor_parallel.md):

    mappings.py           f, g and the other conjugate forward/backward pairs
    tensor.py             ColumnParallelLinear, RowParallelLinear; shards of the full init
    vocab.py              VocabParallelEmbedding, vocab_parallel_cross_entropy
    sequence.py           sequence-parallel LayerNorm and the gradients it leaves partial
    random.py             dropout masks: replicated, sharded, equal to one device's
    tensor_block.py       ParallelAttention, ParallelMLP, ParallelTransformerLayer
    tensor_gpt.py         TensorParallelGPT: GPT's interface, so the engines above wrap it

`nn` knows nothing of any of this: the engines act through `model.hooks` and the
`Parameter` API only, and the tensor-parallel layers reuse nn's ops.
"""

from .ddp import DistributedDataParallel
from .engine import DataParallelEngine, accumulate_gradients
from .flat import FlatParameter, Segment
from .fsdp import FullyShardedDataParallel, ShardingStrategy, hybrid_mesh
from .sharded_optimizer import OwnedPiece, ShardedOptimizer
from .zero import ZeroEngine, zero_engine
from .zero3 import Zero3Engine
from .mappings import (copy_to_tensor_model_parallel_region,
                       gather_from_sequence_parallel_region,
                       gather_from_tensor_model_parallel_region,
                       reduce_from_tensor_model_parallel_region,
                       reduce_scatter_to_sequence_parallel_region,
                       scatter_to_sequence_parallel_region,
                       scatter_to_tensor_model_parallel_region)
from .random import TensorParallelRNG
from .sequence import SequenceParallelGrads, SequenceParallelLayerNorm
from .tensor import ColumnParallelLinear, RowParallelLinear, gather_parameter
from .tensor_block import ParallelAttention, ParallelMLP, ParallelTransformerLayer
from .tensor_gpt import TensorParallelGPT, check_tensor_parallel
from .vocab import (VocabParallelEmbedding, padded_vocab_size, vocab_parallel_cross_entropy,
                    vocab_parallel_cross_entropy_backward)

__all__ = ["DistributedDataParallel", "DataParallelEngine", "accumulate_gradients",
           "FlatParameter", "Segment", "FullyShardedDataParallel", "ShardingStrategy",
           "hybrid_mesh", "OwnedPiece", "ShardedOptimizer", "ZeroEngine", "zero_engine",
           "Zero3Engine",
           "copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "scatter_to_tensor_model_parallel_region", "gather_from_tensor_model_parallel_region",
           "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
           "reduce_scatter_to_sequence_parallel_region", "TensorParallelRNG",
           "SequenceParallelGrads", "SequenceParallelLayerNorm", "ColumnParallelLinear",
           "RowParallelLinear", "gather_parameter", "ParallelAttention", "ParallelMLP",
           "ParallelTransformerLayer", "TensorParallelGPT", "check_tensor_parallel",
           "VocabParallelEmbedding", "padded_vocab_size", "vocab_parallel_cross_entropy",
           "vocab_parallel_cross_entropy_backward"]
