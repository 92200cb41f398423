"""The MPI backend gives what the sim backend gives: results, clocks and traces, per rank.

tests/mpi/program.py runs under `mpiexec -n 4` (mpi4py, the mpich wheel's mpiexec) and,
in this process, on four simulated devices; every array must be identical, bit for bit.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mpi4py")
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROGRAM = os.path.join(HERE, "program.py")


def _load(name: str):
    """A program of this folder, imported by path (tests/mpi is no package)."""
    path = os.path.join(HERE, name)
    spec = importlib.util.spec_from_file_location(f"minipar_mpi_{name[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _program():
    return _load("program.py")


def _mpiexec() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec next to this Python or on PATH (pip install -e '.[mpi]')")
    return found


def _mpirun(n: int, args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return subprocess.run([_mpiexec(), "-n", str(n), sys.executable, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, dict]:
    """(rank -> arrays from the MPI run, rank -> arrays from the sim run)."""
    out = tmp_path_factory.mktemp("mpi")
    proc = _mpirun(4, [PROGRAM, "mpi", str(out)])
    assert proc.returncode == 0, f"mpiexec failed:\n{proc.stdout}\n{proc.stderr}"
    mpi = {}
    for r in range(4):
        with np.load(out / f"rank{r}.npz", allow_pickle=False) as f:
            mpi[r] = {k: f[k] for k in f.files}
    return mpi, _program().run("sim")


def test_every_rank_gets_the_sim_results_bit_for_bit(runs):
    mpi, sim = runs
    for r in range(4):
        assert set(mpi[r]) == set(sim[r]), f"rank {r}: different results"
        for name, want in sim[r].items():
            got = mpi[r][name]
            assert got.dtype == want.dtype, f"rank {r}, {name}: {got.dtype} != {want.dtype}"
            np.testing.assert_array_equal(got, want, err_msg=f"rank {r}, {name}")


def test_the_program_really_exercises_every_path(runs):
    _, sim = runs
    names = {n.split("/")[0] for n in sim[0]} | {n.split("/")[0] for n in sim[3]}
    for kind in ("all_reduce_bf16", "reduce_scatter_1_avg", "all_gather_1", "gather_to_3",
                 "scatter_from_0", "all_to_all", "all_to_all_single_uneven", "recv_ring",
                 "irecv_second", "pair_all_reduce", "evens_bf16", "broadcast_none"):
        assert kind in names
    assert str(sim[0]["dtype:all_reduce_bf16"]) == "bfloat16"
    assert not np.array_equal(sim[0]["irecv_first"], sim[0]["irecv_second"][:2])


def test_clock_and_trace_agree_with_the_sim_backend(runs):
    mpi, sim = runs
    for r in range(4):
        assert mpi[r]["clock"][3] > 0
        np.testing.assert_array_equal(mpi[r]["clock"], sim[r]["clock"], err_msg=f"rank {r}")
        np.testing.assert_array_equal(mpi[r]["trace_names"], sim[r]["trace_names"])
        np.testing.assert_array_equal(mpi[r]["trace_times"], sim[r]["trace_times"])
        np.testing.assert_array_equal(mpi[r]["trace_bytes"], sim[r]["trace_bytes"])
        assert int(mpi[r]["ledger_peak"]) == int(sim[r]["ledger_peak"])
    assert max(mpi[r]["clock"][3] for r in range(4)) == max(sim[r]["clock"][3] for r in range(4))


def test_a_wrong_process_count_says_how_to_launch(tmp_path):
    script = tmp_path / "two.py"
    script.write_text("import minipar as mp\n"
                      "mp.launch(lambda ctx: ctx.rank, world_size=4, backend='mpi')\n")
    proc = _mpirun(2, [str(script)])
    assert proc.returncode != 0
    assert "mpiexec -n 4" in proc.stderr


def test_tensor_and_data_parallel_training_runs_the_same_on_processes(tmp_path):
    """TensorParallelGPT (tp = 2, sequence parallel, dropout) under ZeRO-1 (dp = 2) with
    clipping: four MPI processes end with the sim backend's losses, shards, gradient norm
    and clocks, bit for bit, and the losses are one device's."""
    tp_program = _load("tp_program.py")
    proc = _mpirun(4, [os.path.join(HERE, "tp_program.py"), "mpi", str(tmp_path)])
    assert proc.returncode == 0, f"mpiexec failed:\n{proc.stdout}\n{proc.stderr}"
    sim = tp_program.run("sim")
    for r in range(4):
        with np.load(tmp_path / f"rank{r}.npz", allow_pickle=False) as f:
            got = {k: f[k] for k in f.files}
        assert set(got) == set(sim[r])
        for name, want in sim[r].items():
            np.testing.assert_array_equal(got[name], want, err_msg=f"rank {r}, {name}")

    from minipar.nn import GPT
    from minipar.optim import AdamW, clip_grad_norm_
    import minipar as mp
    with mp.device():
        model = GPT(tp_program.CFG)
        opt = AdamW(model.parameters(), **tp_program.OPT)
        losses = []
        for ids, tgt in tp_program.batches():
            losses.append(model.loss_and_grad(ids, tgt))
            clip_grad_norm_(model.parameters(), tp_program.MAX_NORM)
            opt.step()
            opt.zero_grad()
    dp_mean = np.mean([sim[r]["losses"] for r in (0, 2)], axis=0)  # one rank per dp replica
    np.testing.assert_allclose(dp_mean, losses, rtol=1e-12)


def _one_device_losses(cfg, batches, m: int, opt: dict, max_norm: float) -> list[float]:
    """One device, the m micro-batches of each global batch accumulated in order."""
    from minipar.data.batches import split_microbatches
    from minipar.nn import GPT
    from minipar.optim import AdamW, clip_grad_norm_
    import minipar as mp
    with mp.device():
        model = GPT(cfg)
        opt = AdamW(model.parameters(), **opt)
        losses = []
        for ids, tgt in batches:
            losses.append(np.mean([model.loss_and_grad(x, y, loss_scale=1.0 / m)
                                   for x, y in split_microbatches(ids, tgt, m)]))
            clip_grad_norm_(model.parameters(), max_norm)
            opt.step()
            opt.zero_grad()
    return losses


@pytest.mark.timeout(120)
def test_a_dp_pp_tp_layout_on_eight_processes_equals_the_sim_backend_bit_for_bit(tmp_path):
    """dp x pp x tp = 2 x 2 x 2 built by parallelize, 3 AdamW steps of 4 micro-batches
    with SP, dropout, tied embeddings and the clip active: 1F1B and ZB-H1, each under DDP
    and ZeRO-1. Eight MPI processes end with the sim backend's losses, parameters, norm,
    clock and trace, byte for byte (the norm's sum over the four ranks of tp x pp is
    reduced in group order on both), and the losses are one device's."""
    pp_program = _load("pp_program.py")
    proc = _mpirun(8, [os.path.join(HERE, "pp_program.py"), "mpi", str(tmp_path)],
                   timeout=90)
    assert proc.returncode == 0, f"mpiexec failed:\n{proc.stdout}\n{proc.stderr}"
    want = _one_device_losses(pp_program.CFG, pp_program.batches(), pp_program.MICRO,
                              pp_program.OPT, pp_program.MAX_NORM)
    for case in pp_program.CASES:
        sim = pp_program.run("sim", case)
        for r in range(pp_program.WORLD):
            with np.load(tmp_path / case / f"rank{r}.npz", allow_pickle=False) as f:
                got = {k: f[k] for k in f.files}
            assert set(got) == set(sim[r]), f"{case}, rank {r}: different arrays"
            for name, a in sim[r].items():
                assert got[name].dtype == a.dtype and got[name].shape == a.shape, \
                    f"{case}, rank {r}, {name}: {got[name].dtype}{got[name].shape} != " \
                    f"{a.dtype}{a.shape}"
                assert got[name].tobytes() == a.tobytes(), f"{case}, rank {r}, {name}"
            assert sim[r]["grad_norm"] > pp_program.MAX_NORM  # the clip acts
            assert any(n.startswith("p2p:send") for n in sim[r]["trace_names"])
        params = {n for r in sim for n in sim[r] if n.startswith("param/")}
        assert len(params) > 8 and all(sim[r]["clock"][3] > 0 for r in sim)
        dp_mean = np.mean([sim[r]["losses"] for r in (0, 2)], axis=0)  # both dp blocks
        np.testing.assert_allclose(dp_mean, want, rtol=1e-12, err_msg=case)
