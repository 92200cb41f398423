"""Fault + resume: a rank fails at a chosen step and point of it; the run ends with that
rank's traceback; resuming from the last complete checkpoint continues as the run that
never failed — at the same layout bit for bit (==), and with fewer data-parallel replicas
as the smaller layout would from the same state (==), within the reduction-order bound of
the never-failed run (rtol 1e-12, tests/parallel/conftest.py). A save a fault interrupted
is skipped, saying why, never loaded.

The run: dp 2 x pp 2 x tp 2 (ZeRO-1, 1F1B over 2 micro-batches, sequence parallelism,
tied embeddings, dropout, clipped every step), a checkpoint after every step. Ranks are
placed tp fastest: rank 5 is (pp 1, dp_shard 0, tp 1), rank 3 (pp 0, dp_shard 1, tp 1).
Fewer replicas keep the global batch (8 sequences a step, the same data order): at dp 1
each rank trains on all 8 where it trained on 4.
"""

import shutil

import pytest

from minipar.files import CheckpointError
from minipar.parallel import ParallelDims
from minipar.parallel import checkpoint as ck
from minipar.runtime.errors import RankFailedError
from minipar.runtime.faults import Fault, InjectedFault

STEPS = 5


def config(kit):
    return kit.tiny_config(vocab_size=16, seq_len=8, hidden=16, num_heads=4, ffn_hidden=16,
                           num_layers=4, tie_embeddings=True, dropout=0.1, seed=21)


@pytest.fixture(scope="module")
def never_failed(dpkit, ckrun):
    """(cfg, batches, the run at (2, 2, 2) that never failed, with its state after step 2)."""
    cfg = config(dpkit)
    batches = dpkit.global_batches(cfg, STEPS, 8, seed=21)
    layout = ckrun.Layout(ParallelDims(dp_shard=2, pp=2, tp=2), zero=1, schedule="1f1b",
                          sp=True)
    return cfg, batches, layout, ckrun.session(dpkit, cfg, layout, batches, snapshot=2)


def failed_run(kit, ckrun, never_failed, root, fault):
    """The run of never_failed, saving after every step, with `fault`: its RankFailedError."""
    cfg, batches, layout, _ = never_failed
    with pytest.raises(RankFailedError) as info:
        ckrun.session(kit, cfg, layout, batches, save_root=root, faults=[fault])
    return info.value


@pytest.mark.timeout(180)
def test_a_rank_failing_at_a_schedule_action_resumes_at_the_same_layout_bit_for_bit(
        dpkit, ckrun, never_failed, tmp_path):
    cfg, batches, layout, straight = never_failed
    err = failed_run(dpkit, ckrun, never_failed, tmp_path, Fault(rank=5, step=4, at="1B1"))
    assert err.rank == 5 and isinstance(err.original, InjectedFault)
    assert "rank 5 at 1B1 of step 4" in str(err)
    assert "in _compute" in err.traceback_text and "fault_point" in err.traceback_text
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000001", "step-00000002", "step-00000003"]  # step 4 never reached its save
    resumed = ckrun.session(dpkit, cfg, layout, batches, resume_from=tmp_path)
    assert (resumed.resumed.step, resumed.resumed.skipped) == (3, [])
    assert resumed.losses == [losses[3:] for losses in straight.losses]  # every rank's, ==
    dpkit.assert_state_equal(resumed.state, straight.state)


@pytest.mark.timeout(240)
def test_a_fault_midway_through_a_save_is_skipped_and_the_run_resumes_with_fewer_replicas(
        dpkit, ckrun, never_failed, tmp_path):
    cfg, batches, layout, straight = never_failed
    err = failed_run(dpkit, ckrun, never_failed, tmp_path, Fault(rank=3, step=3, at="save"))
    assert err.rank == 3 and "rank 3 at save of step 3" in str(err)
    unfinished = tmp_path / "step-00000003"
    assert (unfinished / "rank00003.json").is_file()  # rank 3 wrote its file, then failed
    assert not (unfinished / "index.json").exists()
    with pytest.raises(CheckpointError, match="holds rank files but no index.json"):
        ck.read_full_state(unfinished)
    last = ck.latest(tmp_path)
    assert last.step == 2 and [d.name for d, _ in last.skipped] == ["step-00000003"]
    assert "the save did not finish" in last.skipped[0][1]

    # the same layout: as if it never failed, bit for bit; its save of step 3 sets the
    # unfinished one aside instead of writing among its files
    same = ckrun.session(dpkit, cfg, layout, batches, resume_from=tmp_path,
                         save_root=tmp_path, save_every=3)
    assert same.resumed.step == 2
    assert same.losses == [losses[2:] for losses in straight.losses]
    dpkit.assert_state_equal(same.state, straight.state)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000001", "step-00000002", "step-00000003", "step-00000003.old-1"]
    assert ck.latest(tmp_path) == ck.Latest(unfinished, 3, [])
    shutil.rmtree(unfinished)  # the rest resumes from step 2, as after the fault

    # one data-parallel replica fewer (the DP dimension recovered first): the same global
    # batch and data order, each rank's share doubled
    smaller = ckrun.Layout(ParallelDims(pp=2, tp=2), zero=1, schedule="1f1b", sp=True)
    files = ckrun.session(dpkit, cfg, smaller, batches, resume_from=tmp_path)
    memory = ckrun.session(dpkit, cfg, smaller, batches, from_memory=straight.snapshot)
    assert files.losses == memory.losses
    dpkit.assert_state_equal(files.state, memory.state)
    dpkit.assert_close(files.mean_losses, straight.mean_losses[2:], what="dp 2 -> 1")
    dpkit.assert_state_close_by_kind(files.state, straight.state)


@pytest.mark.timeout(120)
def test_saves_mixed_or_missing_are_never_taken_for_complete(dpkit, ckrun, never_failed,
                                                             tmp_path):
    """A directory mixing two saves' files, one missing a rank's file, one renamed to
    another step: each skipped with its reason; none left: refused, listing them."""
    cfg, batches, layout, _ = never_failed
    ckrun.session(dpkit, cfg, layout, batches, steps=3, save_root=tmp_path)
    s1, s2, s3 = (ck.step_dir(tmp_path, n) for n in (1, 2, 3))
    for suffix in (".npz", ".json"):  # step 3's rank 1 file replaced by step 2's
        shutil.copy(s2 / f"rank00001{suffix}", s3 / f"rank00001{suffix}")
    (s2 / "rank00006.npz").unlink()
    s1.rename(ck.step_dir(tmp_path, 7))
    with pytest.raises(CheckpointError) as info:
        ck.latest(tmp_path)
    text = str(info.value)
    assert "holds no complete checkpoint (3 step directories)" in text
    assert "step-00000007: its index says step 1, its name step 7" in text
    assert "step-00000003:" in text and "mixes files of two saves" in text
    assert "step-00000002:" in text and "rank00006.npz" in text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule, rank, at", [
    ("zb_h1", 0, "0W1"),        # a deferred weight gradient of a zero-bubble schedule
    ("dualpipev", 0, "0B0"),    # the backward half of DualPipeV's pair (3F2;0B0)
    ("dualpipev", 1, "2I3"),    # an input-gradient half of its split backward
])
def test_a_fault_at_any_kind_of_action_resumes_bit_for_bit(dpkit, ckrun, tmp_path, schedule,
                                                           rank, at):
    cfg = config(dpkit)
    batches = dpkit.global_batches(cfg, 3, 8, seed=22)
    layout = ckrun.Layout(ParallelDims(pp=2), zero=1, schedule=schedule, m=4)
    straight = ckrun.session(dpkit, cfg, layout, batches)
    with pytest.raises(RankFailedError) as info:
        ckrun.session(dpkit, cfg, layout, batches, save_root=tmp_path,
                      faults=[Fault(rank, 2, at)])
    assert info.value.rank == rank and f"at {at} of step 2" in str(info.value)
    resumed = ckrun.session(dpkit, cfg, layout, batches, resume_from=tmp_path)
    assert resumed.resumed.step == 1
    assert resumed.losses == [losses[1:] for losses in straight.losses]
    dpkit.assert_state_equal(resumed.state, straight.state)
