"""`minipar tour`: a guided run of the simulated cluster, part by part.

    cluster.py          1-6  every collective: what moved where, what it cost, a ring step by
                             step, NVLink against InfiniBand, timelines, overlap
    model.py            7    one training step of the single-device GPT, bytes and FLOPs
    data_parallel.py    8    DDP and ZeRO-1/2/3: memory and traffic against the formulas
    tensor_parallel.py  9    Megatron tensor and sequence parallelism: collectives per layer,
                             activation memory against Table 2, gradients against one device

Each part prints through `out` and checks what it shows against a formula or one device.
"""

from __future__ import annotations

from typing import Optional

from ...viz.chrome import to_chrome_trace
from .cluster import TOPOLOGY, cluster_parts
from .common import Print
from .data_parallel import DP_ATOL_SCALE, DP_RTOL, data_parallel_part
from .model import single_device_part
from .tensor_parallel import tensor_parallel_part

#: the parts after the cluster's, in order: each takes `out`
PARTS = (single_device_part, data_parallel_part, tensor_parallel_part)


def run_tour(out: Print = print, nbytes: int = 4 << 20, trace_path: Optional[str] = None,
             ascii: bool = False, width: int = 72) -> list:
    """Run the tour and print it through `out`; returns the events of part 6 (what the
    Chrome trace at `trace_path` holds)."""
    events = cluster_parts(out, nbytes, ascii, width)
    for part in PARTS:
        out("")
        part(out)
    if trace_path:
        to_chrome_trace(events, trace_path, topology=TOPOLOGY)
        out(f"\nChrome trace written to {trace_path}: open it in https://ui.perfetto.dev "
            "or chrome://tracing")
    return events


__all__ = ["run_tour", "PARTS", "DP_RTOL", "DP_ATOL_SCALE"]
