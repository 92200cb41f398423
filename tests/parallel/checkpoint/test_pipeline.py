"""Checkpoints with the pp coordinate: each pipeline coordinate writes its stages' units; a
pp = 2 save loads at pp = 1 and pp = 4 (and on dp x tp layouts, and one device) bit for
bit, and training resumed there continues as the run that never stopped.

"Continues" has the bound of test_layout.py: another layout reduces in another order, so
losses agree to rtol 1e-12 and the end state to 1e-11 of the largest array of its kind.
"""

import json

import numpy as np
import pytest

import minipar as mp
from minipar.files import load_arrays
from minipar.parallel import ParallelDims, parallelize
from minipar.parallel import checkpoint as ck
from minipar.parallel.checkpoint.full_state import parameter_of
from minipar.runtime.collectives import all_gather

CLIP = 0.05


def session(kit, cfg, dims, pipe, batches, *, load_from=None, resave_to=None, save_to=None,
            form="sharded", **kw):
    """On every rank: load (and save again at once), train `batches`, save. Returns the
    losses (the mean over the dp blocks of each block's, which its every rank reports)
    and the full state held at the end: each rank's parameters (tp shards gathered),
    merged over the stages."""
    def program(ctx):
        run = parallelize(cfg, dims, max_grad_norm=CLIP, **pipe, **kw, **kit.OPT)
        if load_from is not None:
            ck.load(run, load_from)
        if resave_to is not None:
            ck.save_sharded(run, resave_to)
        losses = [run.train_step(ids, tgt) for ids, tgt in batches]
        if save_to is not None:
            (ck.save_sharded if form == "sharded" else ck.save_consolidated)(run, save_to)
        sd, params = run.engine.full_state_dict(), run.model.named_parameters()
        for key in list(sd):
            p = params.get(parameter_of(key))
            if p is not None and getattr(p, "partition_count", 1) > 1:
                sd[key] = all_gather(sd[key], axis=p.partition_dim, group=run.groups.tp)
        where = run.groups.coordinate
        return losses, sd, where["pp"] == where["tp"] == 0

    res = mp.launch(program, dims.world_size)
    state = {k: a for _, sd, _ in res for k, a in sd.items()}
    return np.mean([r[0] for r in res if r[2]], axis=0), state


PP2 = (ParallelDims(pp=2, tp=2), dict(schedule="1f1b", microbatches=2))


@pytest.mark.timeout(120)
def test_a_pp2_save_loads_at_pp1_and_pp4_bit_for_bit_and_continues(dpkit, tmp_path):
    """Saved by pp 2 x tp 2 (1F1B, SP, tied, dropout, clipped) after 2 of 4 steps; resumed
    at pp = 4 (GPipe), pp = 2 interleaved on tp = 1, pp = 1 with dp 2 under ZeRO-3 (one
    stage, and no pipeline at all), and one rank: the state loaded and saved again is the
    file's, bit for bit, and the last 2 steps are the uninterrupted run's — except on the
    layout without a pipeline, whose dropout draws each step's masks over the whole batch
    at once, not micro-batch by micro-batch: another run from the same state."""
    cfg = dpkit.tiny_config(num_layers=4, seq_len=4, vocab_size=16, hidden=8, num_heads=2,
                            ffn_hidden=8, tie_embeddings=True, dropout=0.1, seed=9)
    batches = dpkit.global_batches(cfg, 4, 4, seed=9)
    straight, end = session(dpkit, cfg, *PP2, batches, sequence_parallel=True)
    session(dpkit, cfg, *PP2, batches[:2], sequence_parallel=True, save_to=tmp_path / "ckpt",
            zero=1)
    saved = ck.read_full_state(tmp_path / "ckpt")
    index = json.loads((tmp_path / "ckpt" / "index.json").read_text())
    assert [f["coordinate"] for f in index["files"]] == [
        {"pp": p, "tp": t, "dp_shard": 0} for p in (0, 1) for t in (0, 1)]
    assert [(u["name"], u["pp"]) for u in index["meta"]["units"]] == [
        ("embed", 0), ("blocks.0", 0), ("blocks.1", 0), ("blocks.2", 1), ("blocks.3", 1),
        ("head", 1)]
    assert index["arrays"]["head/param"]["pp"] == 1  # each file holds its stage's units
    assert "head/param" in load_arrays(tmp_path / "ckpt" / "rank00002")[0]
    assert "embed/param" not in load_arrays(tmp_path / "ckpt" / "rank00002")[0]
    one_stage = dict(schedule="1f1b", microbatches=2)
    for i, (dims, pipe, kw) in enumerate([
            (ParallelDims(pp=4), dict(schedule="gpipe", microbatches=2), {}),
            (ParallelDims(pp=2), dict(schedule="interleaved_1f1b", microbatches=2,
                                      chunks=2), {}),
            (ParallelDims(dp_shard=2), one_stage, dict(zero=3)),
            (ParallelDims(dp_shard=2), {}, dict(zero=3)),
            (ParallelDims(), one_stage, {})]):
        again = tmp_path / f"again{i}"
        losses, state = session(dpkit, cfg, dims, pipe, batches[2:], **kw,
                                load_from=tmp_path / "ckpt", resave_to=again)
        dpkit.assert_state_equal(ck.read_full_state(again), saved)
        if not pipe:
            continue  # the whole batch's masks: loaded bit for bit, trained otherwise
        dpkit.assert_close(losses, straight[2:], what=f"losses resumed on {dims} {pipe}")
        dpkit.assert_state_close_by_kind(state, end)


@pytest.mark.timeout(60)
def test_consolidated_and_sharded_saves_of_a_pipeline_hold_the_same_tensors(dpkit, tmp_path):
    """pp 4 with empty stages (a rank of none writes the step only) and ZeRO-1 over
    dp_shard 2: both forms read back as the same full state, bit for bit, and load at
    pp = 2."""
    cfg = dpkit.tiny_config(num_layers=3, seq_len=4, tie_embeddings=True, seed=4)
    batches = dpkit.global_batches(cfg, 1, 8, seed=4)
    dims = ParallelDims(dp_shard=2, pp=4)
    pipe = dict(schedule="1f1b", microbatches=4, layers=[2, 0, 0, 1])
    session(dpkit, cfg, dims, pipe, batches, zero=1, save_to=tmp_path / "s")
    session(dpkit, cfg, dims, pipe, [], zero=1, load_from=tmp_path / "s",
            save_to=tmp_path / "c", form="consolidated")
    sharded, full = ck.read_full_state(tmp_path / "s"), ck.read_full_state(tmp_path / "c")
    dpkit.assert_state_equal(full, sharded)
    empty = load_arrays(tmp_path / "s" / "rank00002")[0]  # pp 1, dp_shard 0: no units
    assert list(empty) == ["meta/step"] and int(empty["meta/step"]) == 1
    _, state = session(dpkit, cfg, ParallelDims(pp=2), dict(schedule="gpipe", microbatches=2),
                       [], load_from=tmp_path / "c")
    state.pop("meta/step")
    dpkit.assert_state_equal(state, {k: v for k, v in full.items() if k != "meta/step"})
