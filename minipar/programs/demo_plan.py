"""The demo's 70B-sized scenarios: too large to execute, so they come from the dry run
(plan/timeline.py) or, with ZeRO, from the planner (plan/rank_memory.py, plan/step_time.py).

    dry run   one train_step of Llama 3 70B's size as a GPT (plan.sized.as_gpt) on DGX A100
              nodes, calibrated clock, bf16, SP: every event of one rank per pipeline
              stage (tp and dp peers do the same work at the same times), and its memory
              over the step: the model states plus the activations held after each action
    planner   ZeRO is not in the dry run: each stage's memory by category from rank_memory
              (its first pipeline rank's peak) and the step's time from step_time; no
              timeline, and the page says so
"""

from __future__ import annotations

from ..plan.layout import Layout
from ..plan.presets import CLUSTERS, MODELS
from ..plan.rank_memory import rank_memory
from ..plan.sized import as_gpt
from ..plan.step_time import step_time
from ..plan.step_tail import Representative
from ..plan.timeline import timeline
from ..runtime.ledger import CATEGORIES
from .demo_rows import journey, model_flops, numbers, row
from .demo_scenario import Scenario, check

CLUSTER = "a100"
MODEL = "llama3-70b"
DTYPE = "bfloat16"
MAX_GRAD_NORM = 1.0  # clipped, as the real runs


def layout_of(s: Scenario) -> Layout:
    """The planner's Layout of a scenario: one sequence a micro-batch, SP when tp > 1, the
    gradients in the model's dtype (as minipar's engines keep them)."""
    return Layout(dp=s.dp, tp=s.tp, pp=s.pp, schedule=s.schedule, chunks=s.chunks,
                  global_batch=s.global_batch, sequence_parallel=s.tp > 1,
                  recompute=s.recompute, zero=s.zero, fp32_grads=False)


def model_info(gpt) -> dict:
    return {"name": gpt.name, "layers": gpt.layers, "hidden": gpt.hidden, "heads": gpt.heads,
            "ffn": gpt.ffn, "vocab": gpt.vocab, "seq_len": gpt.seq_len, "dtype": DTYPE,
            "parameters": gpt.parameters()}


def groups(rep: Representative, world: int) -> dict:
    """A representative rank's groups as demo_rows.group_kind reads them."""
    return {"tp": list(rep.tp), "dp": list(rep.dp), "pp": list(rep.pp),
            "mp": list(rep.model_parallel), "world": list(range(world))}


def plan(s: Scenario) -> dict:
    """The scenario's page data from the dry run, or the planner under ZeRO."""
    check(s)
    gpt, cluster = as_gpt(MODELS[MODEL]), CLUSTERS[CLUSTER]
    nodes = -(-s.gpus // cluster.gpus_per_node)
    topo = cluster.topology(nodes)
    layout = layout_of(s)
    flops = model_flops(s.global_batch, gpt.seq_len, gpt.layers, gpt.hidden, gpt.ffn,
                        gpt.vocab)
    peak = topo.device.peak(DTYPE)
    out = {"scenario": s.as_dict(), "model": model_info(gpt), "device": topo.device.name,
           "capacity": topo.device.memory_bytes, "gpus_per_node": cluster.gpus_per_node,
           "every_rank": False, "sequence_parallel": s.tp > 1, "batch": {
               "global_batch": s.global_batch, "microbatches": s.microbatches,
               "seq_len": gpt.seq_len,
               "blocks": [[[j * s.dp + d] for j in range(s.microbatches)]
                          for d in range(s.dp)]}}
    if s.zero:
        return dict(out, **_planner(s, gpt, layout, cluster, nodes, flops, peak))
    tl = timeline(gpt, layout, topo, dtype=DTYPE, compute_model="calibrated",
                  max_grad_norm=MAX_GRAD_NORM)
    T = tl.step_time
    bandwidth = {topo.intra.name: topo.intra.bandwidth, topo.inter.name: topo.inter.bandwidth}
    rows = []
    for r in tl.ranks:
        states = {c: int(r.states.get(c, 0)) for c in CATEGORIES}
        t = [0.0] + [a for a, _ in r.activations] + [T]
        acts = [0] + [int(b) for _, b in r.activations] + [0]
        memory = {"t": t}
        for c in CATEGORIES:
            memory[c] = acts if c == "activations" else [states[c]] * len(t)
        pk = dict(states, activations=max(acts))
        pk["total"] = sum(states.values()) + max(acts)
        here = {"pp_stage": r.pipeline_rank, "dp_replica": 0, "tp_index": 0,  # tp = dp = 0
                "node": r.rank // cluster.gpus_per_node}
        rows.append(row(r.rank, here, r.events, 0.0, T, bandwidth, memory, pk))
    return dict(out, source="dry-run",
                source_text=f"the dry run of one train_step of {gpt.name} on {s.gpus} "
                            f"{topo.device.name} GPUs (the same events as a real run, "
                            f"without the arithmetic): one rank per pipeline stage drawn, "
                            f"its tp and dp peers do the same",
                numbers=numbers(rows, T, flops, s.gpus, peak), rows=rows,
                journey=journey({r.rank: r.events for r in tl.ranks},
                                {r.rank: groups(Representative(layout, r.pipeline_rank),
                                                s.gpus) for r in tl.ranks}, 0.0))


def _planner(s: Scenario, gpt, layout: Layout, cluster, nodes: int, flops: float,
             peak: float) -> dict:
    """ZeRO: the planner's memory of the first pipeline rank and its step time."""
    mem = rank_memory(gpt, layout, cluster, dropout=False)
    st = step_time(gpt, layout, cluster, dropout=False)
    pk = {c: int(t.peak) for c, t in mem.terms().items()}
    pk["other"] = 0
    pk["total"] = sum(pk.values())
    T = st.seconds
    rows = [dict(pp_stage=0, dp_replica=0, tp_index=0, rank=0, node=0, actions=[], cells="",
                 split=None, memory=None, peak=pk)]
    return {"source": "planner",
            "source_text": f"the planner (formulas, validated against published "
                           f"measurements): the dry run does not model ZeRO-{s.zero}, so "
                           f"there is no timeline; memory is the first pipeline rank's, "
                           f"time shares the slowest pipeline rank's",
            "numbers": {"step_time": T, "compute_share": st.compute / T,
                        "comm_share": st.exposed_communication / T,
                        "idle_share": 1 - (st.compute + st.exposed_communication) / T, "mfu": flops / (T * s.gpus * peak),
                        "model_flops": flops, "peak_memory": pk["total"], "peak_rank": 0},
            "rows": rows, "journey": []}
