"""The simulated cluster: devices, process groups, collectives, memory ledger, clock, trace.

The runtime knows nothing of models. See docs/runtime.md for the execution model.
"""

from .collectives import (ReduceOp, all_gather, all_reduce, all_to_all, all_to_all_single,
                          barrier, broadcast, gather, get_rank, get_world_size, new_group,
                          reduce, reduce_scatter, scatter)
from .compute_model import ComputeModel, GemmEfficiency
from .context import Context, current, device
from .device import DeviceSpec
from .errors import (CollectiveMismatchError, CollectiveTimeoutError, CollectiveUsageError,
                     DeadlockError, MiniparError, RankFailedError, RankThreadError,
                     SimulatedOutOfMemoryError, WorldAborted)
from .group import ProcessGroup
from .launch import launch
from .ledger import CATEGORIES, MemoryLedger
from .mesh import DeviceMesh
from .p2p import irecv, isend, recv, send
from .result import LaunchResult
from .topology import Link, Topology
from .work import Work

__all__ = [
    "ReduceOp", "Work", "all_gather", "all_reduce", "all_to_all", "all_to_all_single",
    "barrier", "broadcast", "gather", "get_rank", "get_world_size", "irecv", "isend",
    "new_group", "recv", "reduce", "reduce_scatter", "scatter", "send", "ComputeModel",
    "GemmEfficiency", "Context", "current",
    "device", "DeviceSpec", "CollectiveMismatchError", "CollectiveTimeoutError",
    "CollectiveUsageError", "DeadlockError", "MiniparError", "RankFailedError",
    "RankThreadError", "SimulatedOutOfMemoryError",
    "WorldAborted", "ProcessGroup", "LaunchResult", "launch", "CATEGORIES", "MemoryLedger",
    "DeviceMesh", "Link", "Topology", "init_device_mesh",
]


def init_device_mesh(shape, mesh_dim_names) -> DeviceMesh:
    """torch.distributed.device_mesh.init_device_mesh's spelling: shape slowest-first."""
    mesh = DeviceMesh(shape, mesh_dim_names)
    ws = current().world_size
    if mesh.size != ws:
        raise ValueError(f"mesh {tuple(shape)} covers {mesh.size} ranks but the world has {ws}")
    return mesh
