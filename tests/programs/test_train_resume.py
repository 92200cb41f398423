"""`minipar train --checkpoint-dir DIR --fail-at RANK:STEP[:POINT]` then `--resume DIR`: the
run that lost a rank ends with its traceback and where to go on from; the resumed run is
the never-failed one bit for bit at the same layout (losses and learning rates ==), and
at fewer dp replicas its losses to rtol 1e-12 (float64: only the reductions' order
differs; the global batch and data order are kept)."""

import re
import shutil

import numpy as np
import pytest

from minipar.cli import main
from minipar.files import CheckpointError
from minipar.parallel import checkpoint as ck
from minipar.programs.train_config import TrainConfig
from minipar.programs.train_parallel import train_parallel
from minipar.programs.train_resume import Recovery, parse_fault
from minipar.runtime.errors import RankFailedError
from minipar.runtime.faults import Fault, InjectedFault

# ~29k parameters, 8 x 16 characters a step, 2 micro-batches, warmup then cosine
TINY = dict(steps=6, global_batch=8, seq_len=16, num_layers=2, hidden=32, num_heads=2,
            lr=1e-2, warmup_steps=2, min_lr=1e-3, num_microbatches=2, dtype="float64")
FLAGS = ["--steps", "6", "--batch", "8", "--seq-len", "16", "--layers", "2", "--hidden", "32",
         "--heads", "2", "--micro-batches", "2", "--warmup", "2", "--quiet"]


@pytest.mark.timeout(120)
def test_a_run_that_lost_a_rank_resumes_as_the_one_that_never_failed(tmp_path):
    root, copy = tmp_path / "ck", tmp_path / "copy"
    cfg = TrainConfig(**TINY, dp=2, pp=2, zero=1)
    straight = train_parallel(cfg)
    with pytest.raises(RankFailedError) as info:  # rank 2: pp 1, dp 0 (tp-cp-ep-dp-pp)
        train_parallel(cfg, recovery=Recovery(root, 2, faults=(Fault(2, 5, "1B1"),)))
    assert info.value.rank == 2 and isinstance(info.value.original, InjectedFault)
    assert sorted(p.name for p in root.iterdir()) == ["step-00000002", "step-00000004"]
    shutil.copytree(root, copy)  # the resumed run saves on into it
    same = train_parallel(cfg, recovery=Recovery(resume=root))
    assert ck.latest(root).step == 6  # it saved steps 5 and 6 there
    assert same.losses == straight.losses[4:] and same.lrs == straight.lrs[4:]
    assert same.grad_norms == straight.grad_norms[4:]
    fewer = train_parallel(TrainConfig(**TINY, pp=2),  # ZeRO-1 over one rank is refused: DDP
                           recovery=Recovery(resume=copy))
    np.testing.assert_allclose(fewer.losses, straight.losses[4:], rtol=1e-12)
    assert fewer.lrs == straight.lrs[4:]
    with pytest.raises(CheckpointError, match="at step 6, and a run of 6 steps leaves nothing"):
        train_parallel(cfg, recovery=Recovery(resume=root))


@pytest.mark.timeout(120)
def test_the_flags_fail_a_rank_report_it_and_resume(tmp_path, capsys):
    """Rank 2 (dp 0, pp 1) writes a file of every save under DDP, and fails after writing
    it: step 4's directory is there without its index whatever the threads' timing. (A
    replica that writes nothing, rank 3, can fail before the writers leave the save's
    collectives: they then abort before creating the directory, and nothing of step 4
    exists at all.)"""
    ck = str(tmp_path / "ck")
    layout = ["--dp", "2", "--pp", "2"]
    assert main(["train", *FLAGS, *layout, "--checkpoint-dir", ck, "--save-every", "1",
                 "--fail-at", "2:4:save"]) == 1
    err = capsys.readouterr().err
    assert "rank 2 failed (an injected fault); the run stopped on every rank" in err
    assert "--- traceback of rank 2 ---" in err and "in save_step" in err
    assert "skipped step-00000004: " in err and "the save did not finish" in err
    assert f"last complete checkpoint: {ck}/step-00000003 (step 3); continue with " \
           f"--resume {ck}" in err
    assert main(["train", *FLAGS, "--pp", "2", "--resume", ck]) == 0  # one replica fewer
    err = capsys.readouterr().err
    assert f"skipped {ck}/step-00000004: " in err and "the save did not finish" in err
    assert f"resuming from {ck}/step-00000003 (step 3); steps 4.. follow" in err


@pytest.mark.parametrize("flags, match", [
    (["--fail-at", "4:1"], r"--fail-at 4:1: the run has ranks 0..1 and steps 1..6"),
    (["--fail-at", "1"], r"--fail-at takes RANK:STEP or RANK:STEP:POINT"),
    (["--fail-at", "1:0"], r"Fault.step must be an integer >= 1"),
    (["--resume", "{tmp}"], r"--resume .*holds no complete checkpoint \(0 step directories\)"),
])
def test_bad_recovery_flags_are_usage_errors(tmp_path, capsys, flags, match):
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    with pytest.raises(SystemExit) as info:
        main(["train", *FLAGS, "--dp", "2", *flags])
    assert info.value.code == 2
    assert re.search(match, capsys.readouterr().err)


@pytest.mark.timeout(60)
def test_a_resume_with_nothing_left_to_train_is_a_usage_error(tmp_path, capsys):
    """Also: every size 1 with --checkpoint-dir trains through parallelize on one rank."""
    one = [*FLAGS, "--steps", "2", "--checkpoint-dir", str(tmp_path), "--save-every", "2"]
    assert main(["train", *one]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000002"]
    with pytest.raises(SystemExit) as info:
        main(["train", *FLAGS, "--steps", "2", "--resume", str(tmp_path)])
    assert info.value.code == 2
    assert "its newest complete checkpoint is at step 2, and --steps 2 leaves nothing to " \
           "train; give more than 2 steps" in capsys.readouterr().err


def test_parse_fault():
    assert parse_fault("5:4:2F1") == Fault(5, 4, "2F1")
    assert parse_fault("0:3") == Fault(0, 3, "step")
