"""The composition home: where the parallel forms meet, and the only place that knows them all.

    dims.py         ParallelDims: sizes of dp_replicate, dp_shard, pp, tp, cp, ep; rank order
    groups.py       ParallelGroups: this rank's group along every dimension, its coordinate
    parallelize.py  parallelize: config + dims -> this rank's model, engine and batch block
    pipeline.py     under pp: this rank's stages, the engine over them, the runner, the loss
    experts.py      a mixture of experts: its layers over ep, its gradients over edp
    context.py      under cp: a rank's rows, its attention core, gradients over dp x cp
    placement.py    check_placement: what a layout's groups cost on a topology, and the fix
"""

from .context import CP_METHODS, check_context
from .dims import DEFAULT_ORDER, ParallelDims
from .groups import ParallelGroups
from .parallelize import (Parallelized, build_engine, build_model, model_parallel_norm,
                          parallelize)
from .pipeline import NoParameters
from .placement import (PlacementFinding, PlacementWarning, StepComm, check_placement,
                        step_comm)

__all__ = ["CP_METHODS", "check_context", "DEFAULT_ORDER", "ParallelDims", "ParallelGroups",
           "Parallelized", "build_engine",
           "build_model", "model_parallel_norm", "parallelize", "NoParameters",
           "PlacementFinding", "PlacementWarning", "StepComm", "check_placement", "step_comm"]
