"""The planner's search (plan/search.py) and `minipar plan`: memory first, then time; the
seed's layout advice reproduced, or the disagreement stated with numbers."""

import json

import pytest

from minipar.cli import main
from minipar.plan.layout import Layout
from minipar.plan.presets import CLUSTERS, MODELS
from minipar.plan.search import candidates, reasons, search
from minipar.plan.rank_memory import rank_memory
from minipar.plan.step_time import step_time

H100 = CLUSTERS["h100"]


@pytest.fixture(scope="module")
def llama70():
    return search(MODELS["llama3-70b"], 256, H100, 512, top=None)


@pytest.mark.timeout(120)
def test_every_plan_fits_and_they_come_fastest_first(llama70):
    assert llama70
    times = [p.time.seconds for p in llama70]
    assert times == sorted(times)
    for p in llama70:
        assert p.memory.peak <= p.memory.capacity and p.layout.gpus == 256
    kept = {p.layout for p in llama70}
    dropped = [lay for lay in candidates(MODELS["llama3-70b"], 256, H100, 512)
               if lay not in kept]
    assert dropped  # memory first: some candidates never got a time
    for lay in dropped[:20]:
        try:
            assert not rank_memory(MODELS["llama3-70b"], lay, H100, dropout=False).fits
        except ValueError:
            pass  # a split the model refuses


@pytest.mark.timeout(120)
def test_tp_stays_inside_the_node(llama70):
    """Checklist 2: tp across nodes carries every layer's collectives over InfiniBand."""
    best = llama70[0]
    assert best.layout.tp <= H100.gpus_per_node
    across = [p for p in llama70 if p.layout.tp > H100.gpus_per_node]
    for p in across:
        assert any("crosses a node" in r for r in p.reasons)
        assert p.time.seconds > best.time.seconds
    lay = Layout(tp=16, pp=2, dp=8, global_batch=512, sequence_parallel=True,
                 recompute="selective", distributed_optimizer=True)
    inside = Layout(tp=8, pp=4, dp=8, global_batch=512, sequence_parallel=True,
                    recompute="selective", distributed_optimizer=True)
    m = MODELS["llama3-70b"]
    t16, t8 = step_time(m, lay, H100, dropout=False), step_time(m, inside, H100, dropout=False)
    assert t16.communication["tp"] > 3 * t8.communication["tp"]  # the seed's incident A


@pytest.mark.timeout(120)
def test_a_small_model_needs_no_pipeline():
    """Checklist 10: at 7B or less, data parallelism (with ZeRO) beats any pipeline."""
    plans = search(MODELS["llama2-7b"], 16, H100, 128, top=None)
    assert plans[0].layout.pp == 1
    for p in plans:
        if p.layout.pp > 1:
            assert any("needs no pipeline" in r for r in p.reasons)


def test_the_reasons_name_the_fix():
    m = MODELS["llama3-70b"]
    lay = Layout(tp=8, pp=2, dp=8, global_batch=16, sequence_parallel=True,
                 distributed_optimizer=True, recompute="full")  # m = 2 on pp 2
    mem, t = rank_memory(m, lay, H100, dropout=False), step_time(m, lay, H100, dropout=False)
    found = reasons(m, lay, H100, mem, t)
    assert any(r.startswith("bubble") and "raise m" in r for r in found)
    assert not any("neither a factor" in r for r in found)  # pp 2 of 16 nodes
    uneven = Layout(tp=4, pp=2, dp=3, global_batch=6)  # 24 GPUs: 3 nodes, pp 2
    assert any("pp 2 is neither a factor nor a multiple of the 3 nodes" in r
               for r in reasons(m, uneven, H100, mem, t))
    across = Layout(tp=16, dp=2, global_batch=2)
    assert any(r.startswith("tp 16 crosses a node of 8 GPUs") and "keep tp <= 8" in r
               for r in reasons(m, across, H100, mem, t))


def test_the_command_lists_plans_and_json(capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpus", "16", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("minipar plan: Llama 3 8B") and "  1. " in out and "  3. " in out
    assert "MFU" in out and "peak" in out
    assert main(["plan", "--model", "llama3-8b", "--gpus", "16", "--top", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and rows[0]["step_seconds"] <= rows[1]["step_seconds"]
    assert {"tp", "pp", "dp", "mfu", "peak_bytes", "reasons"} <= set(rows[0])


@pytest.mark.parametrize("flags, match", [
    (["--model", "llama3-8b", "--gpus", "0"], "--gpus: must be a positive integer"),
    (["--model", "gpt5", "--gpus", "8"], "invalid choice: 'gpt5'"),
    (["--model", "llama3-8b", "--gpus", "7", "--global-batch", "3"],
     "no layout of 7 GPUs splits Llama 3 8B with a global batch of 3"),
    (["--model", "llama3-8b", "--gpus", "8", "--gpu", "tpu"], "invalid choice: 'tpu'"),
])
def test_bad_flags_are_usage_errors(flags, match, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", *flags])
    assert e.value.code == 2 and match in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_mixture_of_experts_is_planned_with_expert_parallelism():
    """Checklist 5: a mixture of experts must add EP; the search spreads Mixtral's experts,
    and a plan that keeps all 8 on every rank says so."""
    plans = search(MODELS["mixtral-8x7b"], 32, H100, 64, top=None)
    assert plans[0].layout.ep > 1
    for p in plans:
        flagged = any("holds all 8 experts" in r for r in p.reasons)
        assert flagged == (p.layout.ep == 1 and p.layout.dp * p.layout.cp > 1)
