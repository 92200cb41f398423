"""Data parallelism: every rank trains on its block of the global batch; gradients are
averaged before the step. Read in this order:

    flat.py               FlatParameter: a unit's parameters in one padded 1-D buffer, N shards
    sharded_optimizer.py  Adam/AdamW on the elements a rank owns (float32 masters, m, v)
    engine.py             what every engine shares: no_sync, step with global-norm clipping,
                          full_state_dict / load_full_state_dict, local_state (LocalState:
                          what this rank holds, for checkpoints)
    experts.py            ExpertDataParallel: a mixture of experts' experts, reduced over
                          their replicas and scaled by 1/ep (DDP)
    ddp.py                DistributedDataParallel: bucketed, overlapped all-reduce (stage 0)
    zero.py               ZeRO-1 and ZeRO-2
    zero3.py              ZeRO-3: parameters gathered around each use, prefetch, limits
    fsdp.py               FullyShardedDataParallel and ShardingStrategy over the above;
                          `zero_engine(model, stage=0..3)` picks an engine by stage number

The engines act through the model's hooks and the `Parameter` API only; they know no other
parallel form. What another form adds to a step (the tensor-parallel group a gradient norm
is also summed over, which parameters are duplicates there) is passed in by parallel/mesh.
"""

from .ddp import DistributedDataParallel
from .engine import DataParallelEngine, LocalState, ModelParallelNorm, accumulate_gradients
from .experts import ExpertDataParallel
from .flat import FlatParameter, FlatShard, Segment
from .fsdp import FullyShardedDataParallel, ShardingStrategy, hybrid_mesh, zero_engine
from .sharded_optimizer import OwnedPiece, ShardedOptimizer
from .zero import ZeroEngine
from .zero3 import Zero3Engine

__all__ = ["DistributedDataParallel", "DataParallelEngine", "ModelParallelNorm",
           "ExpertDataParallel", "accumulate_gradients",
           "LocalState", "FlatParameter", "FlatShard", "Segment", "FullyShardedDataParallel",
           "ShardingStrategy",
           "hybrid_mesh", "OwnedPiece", "ShardedOptimizer", "ZeroEngine", "zero_engine",
           "Zero3Engine"]
