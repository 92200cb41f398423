"""minipar: how large language models are trained across many accelerators, in NumPy.

    import minipar as mp
    def step(ctx):
        return mp.all_reduce(np.full(4, ctx.rank, float))
    mp.launch(step, world_size=8, topology=mp.Topology.nodes(2, gpus_per_node=4))
"""

from .runtime import *  # noqa: F401,F403
from .runtime import __all__ as _runtime_all

__version__ = "0.1.0"
__all__ = list(_runtime_all) + ["__version__"]
