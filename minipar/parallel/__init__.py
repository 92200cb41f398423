"""Parallel training forms, one folder each, and the places where they meet.

    dp/          data parallelism: DDP, ZeRO-1/2/3, FSDP          (docs/data_parallel.md)
    tp/          Megatron tensor and sequence parallelism          (docs/tensor_parallel.md)
    pp/          pipeline schedules as data, lowering, validator, dry run, stages, runner
                                                                  (docs/pipeline_parallel.md)
    ep/          expert parallelism: the all-to-all token dispatcher, the MoE layer
                 with its experts over ep ranks                   (docs/moe.md)
    mesh/        the composition home: ParallelDims, ParallelGroups, parallelize
    checkpoint/  checkpoints that know their layout, loaded into any other

A form never imports a sibling form; what crosses forms is answered in mesh/ and passed in
(docs/architecture.md). `nn` knows nothing of any of this: the engines act through
`model.hooks` and the `Parameter` API only, and the tensor-parallel layers reuse nn's ops.
Every public name of the forms is importable from here.
"""

from .dp import *  # noqa: F401,F403
from .dp import __all__ as _dp_all
from .tp import *  # noqa: F401,F403
from .tp import __all__ as _tp_all
from .pp import *  # noqa: F401,F403
from .pp import __all__ as _pp_all
from .ep import *  # noqa: F401,F403
from .ep import __all__ as _ep_all
from .mesh import *  # noqa: F401,F403
from .mesh import __all__ as _mesh_all

__all__ = (list(_dp_all) + list(_tp_all) + list(_pp_all) + list(_ep_all)
           + list(_mesh_all))
