"""The data of `minipar demo`'s architecture mode: each layout's ranks on nodes, with groups.

    rank = i_tp + tp * (i_dp + dp * i_pp)        node = rank // gpus_per_node

(Megatron's default order "tp-cp-ep-dp-pp", tp fastest; cp = ep = 1 here.) The groups are
not computed by a formula here: each preset layout is launched on simulated devices and
every rank's `ParallelGroups(ParallelDims(...))` is read, so the page shows what the mesh
code builds. The page's script recomputes the same rule for any layout the reader picks;
the browser tests hold the two to each other (tests/viz/test_demo_architecture.py).

The seed's two layouts are the presets: the kitchen (DP 2 x TP 4 x PP 3, 24 GPUs: two
copies of the kitchen, four cooks sharing one pan, three stations in a line) and the
70B layout (TP 4, PP 2, DP 8 on 64 GPUs). `minipar demo --layout DPxTPxPP` adds others.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import re
from typing import Callable, Iterable, Iterator, Optional

from ..parallel.mesh import ParallelDims, ParallelGroups
from ..runtime.launch import launch
from ..viz.demo import render_page
from .demo_plan import plan
from .demo_run import run
from .demo_scenario import BASE, CHOICES as SCENARIO_CHOICES, MAX_RUN_GPUS, RECOMPUTE, \
    SCHEDULES, SEED_LAYOUTS, Scenario, embedded

#: GPUs in a node, as in the planner's presets (NVLink inside a node, InfiniBand between)
GPUS_PER_NODE = 8
#: the largest layout the page draws (a GPU is a button; 512 still fit on a projector)
MAX_GPUS = 512
#: (key, title, dp, tp, pp): the seed's layouts
PRESETS = (("kitchen", "the kitchen: DP 2 x TP 4 x PP 3", 2, 4, 3),
           ("70b", "70B on 64 GPUs: TP 4, PP 2, DP 8", 8, 4, 2))
#: what the page's selects offer (any product up to MAX_GPUS)
CHOICES = {"dp": (1, 2, 3, 4, 6, 8, 16), "tp": (1, 2, 4, 8), "pp": (1, 2, 3, 4, 6, 8)}
#: the kitchen beside the precise terms
CAPTIONS = {"dp": "copies of the kitchen: each cooks its own share of the orders (the batch), "
                  "and they compare notes (average the gradients) at the end of the step",
            "tp": "one huge pan shared by several cooks: every weight matrix is split "
                  "between them, and they talk at every layer",
            "pp": "stations in a line: each station does its layers and passes the dish "
                  "(the activations) to the next"}


def parse_layout(text: str) -> tuple[int, int, int]:
    """"2x4x3" -> (dp, tp, pp) = (2, 4, 3); a ValueError that says what to write."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*[xX×]\s*(\d+)\s*", text)
    if not m:
        raise ValueError(f"expected a layout DPxTPxPP such as 2x4x3, got {text!r}")
    dp, tp, pp = (int(g) for g in m.groups())
    if min(dp, tp, pp) < 1:
        raise ValueError(f"layout {text!r}: every size must be at least 1")
    if dp * tp * pp > MAX_GPUS:
        raise ValueError(f"layout {text!r} has {dp * tp * pp} GPUs; the demo draws at most "
                         f"{MAX_GPUS}")
    return dp, tp, pp


def layout_data(dp: int, tp: int, pp: int, key: str = "", title: str = "",
                gpus_per_node: int = GPUS_PER_NODE) -> dict:
    """One layout for the page: sizes, GPU and node counts, and each rank's node,
    coordinate and tp / pp / dp groups as `ParallelGroups` builds them on a launched world."""
    dims = ParallelDims(dp_replicate=dp, tp=tp, pp=pp)
    world = dims.world_size

    def groups(ctx):
        if ctx.rank != 0:
            return None
        out = []
        for r in range(world):
            g = ParallelGroups(dims, rank=r)
            out.append({"rank": r, "node": r // gpus_per_node,
                        "tp_index": g.coordinate["tp"], "pp_stage": g.coordinate["pp"],
                        "dp_replica": g.dp_rank, "tp": list(g.tp.ranks),
                        "pp": list(g.pp.ranks), "dp": list(g.dp.ranks)})
        return out

    ranks = launch(groups, world_size=world)[0]
    return {"key": key or f"{dp}x{tp}x{pp}", "title": title or f"DP {dp} x TP {tp} x PP {pp}",
            "dp": dp, "tp": tp, "pp": pp, "gpus": world, "gpus_per_node": gpus_per_node,
            "nodes": math.ceil(world / gpus_per_node), "ranks": ranks}


def compact(x, digits: int = 6):
    """x with every float rounded to `digits` significant digits (the page's JSON is a
    tenth of the size; times and bytes keep more precision than any pixel or label)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: compact(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [compact(v, digits) for v in x]
    return x


def scenario_data(s: Scenario) -> dict:
    """One scenario's page data: a real run of the tiny model, or the 70B's dry run or plan."""
    return compact(run(s) if s.model == "tiny" else plan(s))


def demo_data(extra: Iterable[tuple[int, int, int]] = (), scenarios: Optional[Iterable[
        Scenario]] = None, progress: Optional[Callable[[int, int, str], None]] = None,
        served: bool = False, jobs: Optional[int] = None) -> dict:
    """Everything the page embeds: the architecture mode's presets and any extra layouts,
    the choices and captions, and the scenarios of the other three modes (default: the
    embedded set, demo_scenario.embedded), computed by `jobs` processes (default: one a
    core; 1: in this process); progress(i, n, key) as each scenario is done."""
    layouts = [layout_data(dp, tp, pp, key, title) for key, title, dp, tp, pp in PRESETS]
    seen = {(d["dp"], d["tp"], d["pp"]) for d in layouts}
    for dp, tp, pp in extra:
        if (dp, tp, pp) not in seen:
            seen.add((dp, tp, pp))
            layouts.append(layout_data(dp, tp, pp))
    todo = list(embedded() if scenarios is None else scenarios)
    computed = {}
    for i, (key, got) in enumerate(_computed(todo, jobs)):
        computed[key] = got
        if progress is not None:
            progress(i + 1, len(todo), key)
    computed = {s.key: computed[s.key] for s in todo}  # in the embedded order
    return {"layouts": layouts, "choices": {k: list(v) for k, v in CHOICES.items()},
            "gpus_per_node": GPUS_PER_NODE, "max_gpus": MAX_GPUS, "captions": CAPTIONS,
            "order": "tp-cp-ep-dp-pp", "scenarios": computed,
            "base": {m: BASE[m].key for m in BASE}, "controls": controls(),
            "served": served}


def _keyed(s: Scenario) -> tuple[str, dict]:
    return s.key, scenario_data(s)


def _computed(todo: list, jobs: Optional[int]) -> Iterator[tuple[str, dict]]:
    """(key, data) of each scenario as it is done: in this process, or over a pool of
    worker processes (each a scenario at a time: the real runs' ranks are threads, and
    NumPy's arithmetic holds the GIL for work this small)."""
    jobs = min(jobs or os.cpu_count() or 1, len(todo))
    if jobs <= 1:
        yield from map(_keyed, todo)
        return
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        futures = [pool.submit(_keyed, s) for s in todo]
        for f in concurrent.futures.as_completed(futures):
            yield f.result()


def controls() -> dict:
    """What the scenario controls offer, per model (the page greys out what check refuses)."""
    layouts = {m: [list(x) for x in SEED_LAYOUTS[m]] for m in SEED_LAYOUTS}
    return {"models": {"tiny": "tiny GPT (executed: a real run)",
                       "70b": "Llama 3 70B-sized (dry run / planner)"},
            "dp": {"tiny": [1, 2, 4], "70b": [1, 2, 4, 8, 16]},
            "tp": {"tiny": [1, 2, 4], "70b": [1, 2, 4, 8]},
            "pp": {"tiny": [1, 2, 4], "70b": [1, 2, 3, 4]},
            "microbatches": {m: list(v) for m, v in SCENARIO_CHOICES["microbatches"].items()},
            "chunks": [1, 2], "schedule": list(SCHEDULES), "zero": [0, 1, 2, 3],
            "recompute": list(RECOMPUTE), "seed_layouts": layouts,
            "max_run_gpus": MAX_RUN_GPUS}


def write_demo(path: str, extra: Iterable[tuple[int, int, int]] = (),
               scenarios: Optional[Iterable[Scenario]] = None,
               progress: Optional[Callable[[int, int, str], None]] = None,
               jobs: Optional[int] = None) -> dict:
    """Write the self-contained page to `path`; return the data it embeds (demo_data's
    arguments)."""
    data = demo_data(extra, scenarios, progress, jobs=jobs)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_page(data))
    return data
