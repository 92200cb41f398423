"""The composition home: where the parallel forms meet, and the only place that knows them all.

    dims.py         ParallelDims: sizes of dp_replicate, dp_shard, pp, tp, cp, ep; rank order
    groups.py       ParallelGroups: this rank's group along every dimension, its coordinate
    parallelize.py  parallelize: config + dims -> this rank's model, engine and batch block
"""

from .dims import DEFAULT_ORDER, ParallelDims
from .groups import ParallelGroups
from .parallelize import (Parallelized, build_engine, build_model, model_parallel_norm,
                          parallelize)

__all__ = ["DEFAULT_ORDER", "ParallelDims", "ParallelGroups", "Parallelized", "build_engine",
           "build_model", "model_parallel_norm", "parallelize"]
