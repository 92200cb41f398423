"""`minipar train --dp --pp --tp`: any layout trains like one device; the end-of-run report."""

import re

import numpy as np
import pytest

from minipar.cli import main
from minipar.programs.train import TrainConfig, train
from minipar.programs.train_parallel import train_parallel
from minipar.programs.train_timing import split_step
from minipar.runtime.trace import Event

# ~29k parameters, 8 x 16 characters a step, 2 micro-batches: about 0.3 s per run of 4 ranks
TINY = dict(steps=4, global_batch=8, seq_len=16, num_layers=2, hidden=32, num_heads=2,
            lr=1e-2, warmup_steps=2, min_lr=1e-3, num_microbatches=2, dtype="float64")
FLAGS = ["--steps", "3", "--batch", "8", "--seq-len", "16", "--layers", "2", "--hidden", "32",
         "--heads", "2", "--micro-batches", "2", "--quiet"]
LAYOUTS = {"dp 2 x tp 2": dict(dp=2, tp=2),
           "pp 2 x tp 2 + SP": dict(pp=2, tp=2, sequence_parallel=True),
           "dp 2 (ZeRO-1) x pp 2": dict(dp=2, pp=2, zero=1),
           "dp 2 x pp 2 x tp 2 on 2 nodes": dict(dp=2, pp=2, tp=2, nodes=2),
           "dp 2 x pp 2 x tp 2 on 2 nodes, order tp-pp-dp":
               dict(dp=2, pp=2, tp=2, nodes=2, order="tp-pp-dp"),
           "dp 4 (ZeRO-3, 2 shards x 2 replicas) on 2 nodes":
               dict(dp=4, zero=3, dp_replicate=2, gpus_per_node=2)}


@pytest.fixture(scope="module")
def one():
    return train(TrainConfig(**TINY))


@pytest.fixture(scope="module")
def runs():
    return {name: train_parallel(TrainConfig(**TINY, **kw)) for name, kw in LAYOUTS.items()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_trains_like_the_all_ones_run_in_float64(one, runs, name):
    """The losses and gradient norms of every step equal one device's (rtol 1e-12), the
    learning rates exactly, the weights at the end to 1e-11 of the largest; the clock is
    charged the same matmul FLOPs in all."""
    r = runs[name]
    assert r.world_size == TrainConfig(**TINY, **LAYOUTS[name]).world_size > 1
    np.testing.assert_allclose(r.losses, one.losses, rtol=1e-12)
    np.testing.assert_allclose(r.grad_norms, one.grad_norms, rtol=1e-12)
    assert r.lrs == one.lrs
    for a, b in zip(r.model.parameters(), one.model.parameters()):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-12,
                                   atol=1e-11 * np.abs(b.data).max(), err_msg=a.name)
    assert r.clock_flops_per_step == pytest.approx(one.clock_flops_per_step, rel=1e-12)


def test_every_size_1_is_the_single_device_run(capsys):
    """--dp 1 --pp 1 --tp 1 --zero 0 is the command without them: the same summary."""
    assert not TrainConfig(**TINY, dp=1, pp=1, tp=1).parallel
    assert main(["train", *FLAGS]) == 0
    plain = capsys.readouterr().out
    assert main(["train", *FLAGS, "--dp", "1", "--pp", "1", "--tp", "1", "--zero", "0"]) == 0
    ones = capsys.readouterr().out
    def strip(text):
        return re.sub(r"wall time .*", "", text)
    assert strip(plain) == strip(ones) and "on one simulated H100" in plain
    assert "time split" not in plain  # one device: compute is the whole step


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_ranks_split_adds_up_to_the_step_and_mfu_divides_by_the_world(runs, name):
    r = runs[name]
    T = r.sim_step_times[-1]
    assert len(r.time_split) == r.world_size == len(r.rank_peaks)
    for s in r.time_split:
        assert sum(s.values()) == pytest.approx(T, rel=1e-12)
        assert min(s.values()) >= 0 and s["compute"] > 0
        assert s["NVLink4"] > 0  # tp's or dp's collectives on the node's link
    assert ("IB-NDR400" in r.time_split[0]) == ("nodes" in name)
    assert r.mfu == pytest.approx(r.model_flops_per_step
                                  / (r.sim_step_time * r.peak_flops * r.world_size), rel=1e-12)


def test_one_devices_step_is_all_compute(one):
    (s,) = one.time_split
    assert s == {"compute": pytest.approx(one.sim_step_times[-1], rel=1e-12), "idle": 0.0}


def test_the_pipeline_stage_that_waits_for_the_other_shows_idle_time(runs):
    """pp 2: each stage idles while the other works (the bubble); its idle is more than the
    schedule's own share with free messages would need to be zero."""
    r = runs["pp 2 x tp 2 + SP"]
    assert all(s["idle"] > 0 for s in r.time_split)


def test_ddp_replicates_the_model_states_and_zero_1_halves_the_optimizers(one, runs):
    """Per rank, the ledger's peaks: DDP (dp 2 x tp 2 holds half the matrices per tp rank,
    so compare dp 2 alone) holds one device's parameters, gradients and Adam moments;
    ZeRO-1 over dp 2 holds half of the moments, exactly (29,184 parameters split evenly)."""
    ddp = train_parallel(TrainConfig(**{**TINY, "steps": 1, "warmup_steps": 0}, dp=2))
    z1 = train_parallel(TrainConfig(**{**TINY, "steps": 1, "warmup_steps": 0}, dp=2, zero=1))
    mine = one.rank_peaks[0]
    for peaks in ddp.rank_peaks:
        for c in ("parameters", "gradients", "optimizer_states"):
            assert peaks[c] == mine[c], c
    assert [p["optimizer_states"] for p in z1.rank_peaks] == [mine["optimizer_states"] // 2] * 2


def test_pipeline_ranks_hold_their_stages_parameters_only(one, runs):
    """dp 2 (ZeRO-1) x pp 2: ranks 0 and 2 (dp 0, pp 0 and 1; tp fastest, pp slowest) hold
    the two stages; their parameters add up to one device's, to the byte (peaks over the
    steps: the build's full-shape initialisation is not counted)."""
    peaks = runs["dp 2 (ZeRO-1) x pp 2"].rank_peaks
    assert 0 < peaks[0]["parameters"] < one.rank_peaks[0]["parameters"]
    assert peaks[0]["parameters"] + peaks[2]["parameters"] == one.rank_peaks[0]["parameters"]
    assert peaks[0]["parameters"] == peaks[1]["parameters"]  # dp replicas of one stage


def test_split_step_on_a_hand_made_trace():
    """compute [0,1) and [4,5); a NVLink collective [1,3) and an IB one [2,4) (the slower
    wins [2,3)); a receive hidden under the compute; a pipeline action's span (meta
    'action') ignored; the window is T = 6: compute 2, NVLink 1, IB 2, idle 1."""
    ev = [Event(0, "compute", "matmul", 0, 1), Event(0, "compute", "F", 0, 5,
                                                     meta={"action": "0F0"}),
          Event(0, "comm", "all_reduce", 1, 3, meta={"link": "NVLink4"}),
          Event(0, "comm", "all_reduce", 2, 4, meta={"link": "IB-NDR400"}),
          Event(0, "recv", "recv", 4.2, 4.8, meta={"link": "IB-NDR400"}),
          Event(0, "compute", "matmul", 4, 5)]
    bw = {"NVLink4": 450e9, "IB-NDR400": 50e9}
    assert split_step(ev, 0.0, 6.0, bw, ["NVLink4"]) == {
        "compute": 2.0, "NVLink4": 1.0, "IB-NDR400": 2.0, "idle": 1.0}
    # a hierarchical collective runs at its slowest part; a window clips what is outside
    ev = [Event(0, "comm", "all_reduce", -1, 2, meta={"link": "NVLink4+IB-NDR400"}),
          Event(0, "comm", "all_reduce", 1, 3, meta={"link": "IB-NDR400"})]
    assert split_step(ev, 0.0, 4.0, bw) == {"compute": 0.0, "NVLink4+IB-NDR400": 1.0,
                                            "IB-NDR400": 2.0, "idle": 1.0}


def test_the_command_reports_a_3d_run(capsys):
    assert main(["train", *FLAGS, "--dp", "2", "--pp", "2", "--tp", "2", "--zero", "1",
                 "--sp", "--gpus-per-node", "4"]) == 0
    cap = capsys.readouterr()
    out = cap.out
    # the placement check: pp across the nodes costs more than dp there; the run goes on
    assert cap.err.startswith("minipar train: placement: --order tp-cp-ep-dp-pp communicates")
    assert "placement='any'" not in cap.err  # the command runs it as asked
    assert "give --order tp-pp-dp-cp-ep (running it as asked)" in cap.err
    for what in ("on 8 simulated H100-SXM-80GB devices, a pipeline of 2 stages",
                 "layout          dp 2 (ZeRO-1) x pp 2 x tp 2 + SP = 8 ranks, laid out in "
                 "the order tp-cp-ep-dp-pp",
                 "cluster         2 node(s) x 4 H100-SXM-80GB",
                 "exposed NVLink4", "exposed IB-NDR400", "ranks 0-3", "ranks 4-7",
                 "memory peaks    on each rank", "optimizer_states", "(the slowest rank's)"):
        assert what in out, what


@pytest.mark.parametrize("flags, words", [
    (["--tp", "4", "--heads", "4"], ["--tp 4 cannot split the vocabulary of 50 entries",
                                     "--make-vocab-size-divisible-by 4", "{1, 2, 5, 10, 25, 50}"]),
    (["--tp", "2", "--heads", "1", "--hidden", "32"], ["--tp 2: --heads = 1 cannot be split",
                                                       "choose --heads divisible by --tp"]),
    (["--tp", "2", "--sp", "--seq-len", "15"], ["--seq-len = 15 cannot be split across --tp 2"]),
    (["--dp", "3"], ["--batch 8 cannot be shared by --dp 3 x --micro-batches 2 = 6"]),
    (["--zero", "2"], ["--zero 2 partitions", "give --dp N"]),
    (["--sp"], ["--sp splits each sequence", "--tp is 1"]),
    (["--dp", "2", "--nodes", "3"], ["--nodes 3 does not divide", "{1, 2}"]),
    (["--dp", "2", "--tp", "2", "--nodes", "2", "--gpus-per-node", "4"],
     ["--nodes 2 x --gpus-per-node 4 = 8 devices, but --dp 2 x --pp 1 x --tp 2 = 4 ranks"]),
    (["--dp", "2", "--dtype", "float16"], ["loss scaling", "--dtype bfloat16"]),
    (["--zero", "4"], ["argument --zero: invalid choice: 4"]),
    (["--tp", "2", "--order", "tp-xx"], ["order 'tp-xx' must list distinct dimensions"]),
    (["--dp", "4", "--dp-replicate", "2"], ["--dp-replicate 2 replicates ZeRO's shards",
                                           "--zero 0, DDP, replicates already"]),
    (["--dp", "4", "--zero", "1", "--dp-replicate", "3"], ["--dp-replicate in {1, 2, 4}"]),
])
def test_layouts_that_cannot_run_are_usage_errors_naming_the_flags(capsys, flags, words):
    with pytest.raises(SystemExit) as e:
        main(["train", *FLAGS, *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: minipar" in err
    for w in words:
        assert w in err, (w, err)


def test_a_padded_vocabulary_trains_the_same_model_on_every_layout():
    """--make-vocab-size-divisible-by 4: one device and tp 4 both train the 52-entry model."""
    cfg = dict(TINY, steps=2, num_heads=4, vocab_divisible_by=4)
    a, b = train(TrainConfig(**cfg)), train_parallel(TrainConfig(**cfg, tp=4))
    assert a.model.cfg.vocab_size == b.model.cfg.vocab_size == 52
    np.testing.assert_allclose(b.losses, a.losses, rtol=1e-12)
