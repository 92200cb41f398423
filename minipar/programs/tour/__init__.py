"""`minipar tour`: a guided run of the simulated cluster, part by part.

    cluster.py          1-6  every collective: what moved where, what it cost, a ring step by
                             step, NVLink against InfiniBand, timelines, overlap
    model.py            7    one training step of the single-device GPT, bytes and FLOPs
    data_parallel.py    8    DDP and ZeRO-1/2/3: memory and traffic against the formulas
    tensor_parallel.py  9    Megatron tensor and sequence parallelism: collectives per layer,
                             activation memory against Table 2, gradients against one device
    pipeline_parallel.py 10  a pp = 4 pipeline under 1F1B: its schedule from the trace, the
                             activations in flight, one device's loss, the bubble measured
    zero_bubble.py      11   1F1B, ZB-H1 and DualPipeV on the same pp = 4 run: each drawn
                             from its trace (I and W visible), its bubble and peak
                             activations measured, its loss one device's
    three_d.py          12   dp 2 x pp 2 x tp 2 through parallelize: each rank's coordinate
                             and groups, the bytes of each group by link class from the
                             trace, the loss and gradients one device's
    experts.py          13   a mixture of experts over ep = 4 in dp = 8: each expert's load,
                             the drops, the all-to-alls' bytes, the parameters a rank holds,
                             the step against one device
    context.py          14   ring attention and Ulysses over cp = 4 in each node: both equal
                             one device, zigzag's even FLOPs against contiguous's, the bytes
    planner.py          15   the planner: its memory against a run's ledger to the byte, a
                             70B layout's memory and time, the search for an 8B on 16 GPUs

Each part prints through `out` and checks what it shows against a formula or one device,
and passes every launch it runs to `record`; `--trace` writes them all, one after another,
into one Chrome trace.
"""

from __future__ import annotations

from typing import Optional

from ...viz.chrome import one_after_another, to_chrome_trace
from .cluster import ALIGN_BYTES, MAX_MEGABYTES, TOPOLOGY, cluster_parts, tour_nbytes
from .common import Print, Recorder, ascii_print, to_ascii
from .data_parallel import DP_ATOL_SCALE, DP_RTOL, data_parallel_part
from .model import single_device_part
from .planner import planner_part
from .pipeline_parallel import pipeline_parallel_part
from .tensor_parallel import tensor_parallel_part
from .context import context_part
from .experts import experts_part
from .three_d import three_d_part
from .zero_bubble import zero_bubble_part

#: the parts after the cluster's, in order: each takes `out` and `record`
PARTS = (single_device_part, data_parallel_part, tensor_parallel_part, pipeline_parallel_part,
         zero_bubble_part, three_d_part, experts_part, context_part, planner_part)


def run_tour(out: Print = print, nbytes: int = 4 << 20, trace_path: Optional[str] = None,
             ascii: bool = False, width: int = 72) -> list:
    """Run the tour and print it through `out` (ASCII only with `ascii`); nbytes is the
    per-rank buffer of parts 2-6, a multiple of ALIGN_BYTES (`tour_nbytes(megabytes)`).
    Returns every launch as (label, events), in order: what the Chrome trace at
    `trace_path` holds, one launch after another."""
    if ascii:
        out = ascii_print(out)
    record = Recorder()
    cluster_parts(out, nbytes, ascii, width, record)
    for part in PARTS:
        out("")
        part(out, record)
    out("")
    out("To see it all: `minipar demo` writes demo.html, one page that opens offline, in")
    out("four modes: the kitchen's mesh on its nodes (architecture), one batch stepping")
    out("through a real run's collectives (data), every rank's memory as ZeRO and recompute")
    out("change it (state), schedules side by side with their idle time and MFU")
    out("(performance). `minipar demo --serve` computes any layout the page asks for")
    out("(docs/demo.md).")
    if trace_path:
        events, sections = one_after_another(record.runs)
        to_chrome_trace(events, trace_path, topology=TOPOLOGY,
                        world_size=TOPOLOGY.world_size, sections=sections)
        out(f"\nChrome trace of every part ({len(record.runs)} launches, one after another) "
            f"written to {trace_path}: open it in https://ui.perfetto.dev or chrome://tracing")
    return record.runs


__all__ = ["run_tour", "PARTS", "DP_RTOL", "DP_ATOL_SCALE", "tour_nbytes", "MAX_MEGABYTES",
           "ALIGN_BYTES", "ascii_print", "to_ascii"]
