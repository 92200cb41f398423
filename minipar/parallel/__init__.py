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

`nn` knows nothing of any of this: the engines act through `model.hooks` and the
`Parameter` API only.
"""

from .ddp import DistributedDataParallel
from .engine import DataParallelEngine, accumulate_gradients
from .flat import FlatParameter, Segment
from .fsdp import FullyShardedDataParallel, ShardingStrategy, hybrid_mesh
from .sharded_optimizer import OwnedPiece, ShardedOptimizer
from .zero import ZeroEngine, zero_engine
from .zero3 import Zero3Engine

__all__ = ["DistributedDataParallel", "DataParallelEngine", "accumulate_gradients",
           "FlatParameter", "Segment", "FullyShardedDataParallel", "ShardingStrategy",
           "hybrid_mesh", "OwnedPiece", "ShardedOptimizer", "ZeroEngine", "zero_engine",
           "Zero3Engine"]
