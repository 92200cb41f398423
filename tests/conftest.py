"""Shared test set-up: hypothesis profiles (CI is derandomized, with no deadline), the
GPT steps fixture, one cached run of each lesson file, the demo's page, and a direct launch
of the demo's tiny scenarios."""

import functools
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=25, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.register_profile("thorough", deadline=None, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The lesson tests rerun lessons in their own process (runpy) to read their variables:
# there, figures would be drawn beside the lessons and cost a second or so each. No
# figures in this process and its children, unless a test asks (the run_lesson fixture
# below gives each lesson's script run a directory of its own, and the notebook tests
# and tests/viz/test_figures.py set their own).
os.environ["MINIPAR_FIGURES"] = "none"


def by_steps(model, ids, tgt, rng, k):
    """embed -> blocks 0..k -> blocks k..L -> head, then the backwards in reverse: the
    steps a pipeline stage will run, against which `loss_and_grad` is checked."""
    L = len(model.blocks)
    x, s_embed = model.embed_forward(ids, rng)  # x: [s, b, h] ([s/t, b, h] with SP)
    x, s_low = model.blocks_forward(x, rng, 0, k)
    x, s_high = model.blocks_forward(x, rng, k, L)
    loss, s_head = model.head_forward(x, tgt)
    dx = model.head_backward(s_head, 1.0)
    dx = model.blocks_backward(dx, s_high, k, L)
    dx = model.blocks_backward(dx, s_low, 0, k)
    model.embed_backward(dx, s_embed)
    return loss


@pytest.fixture
def gpt_steps():
    """by_steps(model, ids, targets, rng, k): a GPT's forward and backward run step by step."""
    return by_steps


@dataclass(frozen=True)
class LessonRun:
    """What `python lessons/NN_topic/lesson.py` did: its exit status, output, the
    processor (user + system) and wall seconds its process took, and the directory its
    figures went to ($MINIPAR_FIGURES: empty, or absent, if it drew none)."""

    returncode: int
    stdout: str
    stderr: str
    cpu: float
    wall: float
    figures: Path


def _run_lesson(path: str, figures: Path) -> LessonRun:
    """Run a lesson file with plain python, its figures written to `figures`."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root), MPLBACKEND="Agg", MINIPAR_FIGURES=str(figures))
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run([sys.executable, path], cwd=root, env=env, capture_output=True,
                          text=True, timeout=60)
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - start
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return LessonRun(proc.returncode, proc.stdout, proc.stderr, cpu, wall, figures)


@pytest.fixture(scope="session")
def run_lesson(tmp_path_factory, worker_id):
    """run_lesson(path) -> LessonRun: each lesson file run once for the whole test run (a
    lesson takes 3-8 s, and tests in several xdist workers read its output, time and
    figures: the first to ask runs it, under a lock, and the others read what it left),
    its figures in a directory of the run's (one per lesson), not beside the lesson."""
    import fcntl
    import json

    root = tmp_path_factory.getbasetemp()  # this run's, and with xdist its workers' parent
    root = (root if worker_id == "master" else root.parent) / "lessons_run"
    root.mkdir(exist_ok=True)

    @functools.lru_cache(maxsize=None)
    def run(path: str) -> LessonRun:
        name = Path(path).parent.name
        saved = root / f"{name}.json"
        with open(root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not saved.exists():
                done = _run_lesson(path, root / name)
                saved.write_text(json.dumps({**done.__dict__, "figures": str(done.figures)}),
                                 encoding="utf-8")
            data = json.loads(saved.read_text(encoding="utf-8"))
        return LessonRun(**{**data, "figures": Path(data["figures"])})
    return run


@pytest.fixture(scope="session")
def demo_page(tmp_path_factory, worker_id):
    """`minipar demo`'s page with the 4x2x2 layout added: (path, the data it embeds). It
    takes about 5 s on two cores (the embedded scenarios' real runs and dry runs), so it
    is written once for the whole run: the xdist workers share it through a lock file."""
    import fcntl
    import json

    from minipar.programs.demo import write_demo
    root = tmp_path_factory.getbasetemp()  # this run's, and with xdist its workers' parent
    root = root if worker_id == "master" else root.parent
    path, saved = root / "demo.html", root / "demo.json"
    with open(root / "demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker writes; the others wait, then read
        if not saved.exists():
            data = write_demo(str(path), [(4, 2, 2)])
            saved.write_text(json.dumps(data), encoding="utf-8")
        data = json.loads(saved.read_text(encoding="utf-8"))
    return path, data


def _tiny_launch(s):
    """The tiny scenario `s`'s training step launched here, without the demo's code but with
    the arguments minipar/programs/demo_run.py gives (clipping at 1.0, ZeRO over dp_shard,
    schedule arguments only when pp > 1, A100 nodes of 8): per rank (the step's start and
    end on its clock, its ledger's peak by category over the step, its peak total, what it
    holds by category at the end)."""
    import numpy as np

    from minipar.nn.gpt import GPTConfig
    from minipar.parallel.mesh import ParallelDims
    from minipar.parallel.mesh.parallelize import parallelize
    from minipar.programs.demo_scenario import TINY, TINY_BATCH
    from minipar.runtime.device import DeviceSpec
    from minipar.runtime.launch import launch
    from minipar.runtime.ledger import CATEGORIES
    from minipar.runtime.topology import Topology
    cfg = GPTConfig(**TINY, dtype="float32", recompute=s.recompute)
    dp = dict(dp_shard=s.dp) if s.zero else dict(dp_replicate=s.dp)
    dims = ParallelDims(**dp, tp=s.tp, pp=s.pp)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (cfg.seq_len, TINY_BATCH))
    tgt = rng.integers(0, cfg.vocab_size, (cfg.seq_len, TINY_BATCH))
    pipe = dict(schedule=s.schedule, microbatches=s.microbatches,
                chunks=s.chunks if s.chunks > 1 else None) if s.pp > 1 else {}

    def fn(ctx):
        p = parallelize(cfg, dims, zero=s.zero or None, sequence_parallel=s.tp > 1, lr=1e-3,
                        max_grad_norm=1.0, placement="any", **pipe)
        t0 = ctx.clock.elapsed()
        ctx.ledger.reset_peak()
        p.train_step(ids, tgt)
        return t0, ctx.clock.elapsed(), {c: ctx.ledger.peak(c) for c in CATEGORIES}, \
            ctx.ledger.peak(), {c: ctx.ledger.held(c) for c in CATEGORIES}
    topology = Topology.nodes(max(1, s.gpus // 8), min(s.gpus, 8), DeviceSpec.a100_80gb())
    return launch(fn, s.gpus, topology=topology)


@pytest.fixture(scope="session")
def tiny_launch():
    """tiny_launch(scenario) -> per rank (t0, t_end, peak by category, peak total, held by
    category): one step of the demo's tiny GPT, to hold the demo's numbers to
    (tests/programs/test_demo_scenarios.py, tests/viz/test_demo_numbers.py)."""
    return _tiny_launch


@pytest.fixture
def serve_demo():
    """serve_demo(data) -> (the root URL, the keys the server computed, in order): `minipar
    demo --serve`'s server on a free port in a thread, computing with the demo's own
    scenario_data; stopped when the test ends."""
    import threading

    from minipar.programs.demo import scenario_data
    from minipar.programs.demo_serve import DemoServer
    servers = []

    def start(data: dict):
        asked = []

        def compute(s):
            asked.append(s.key)
            return scenario_data(s)
        server = DemoServer(("127.0.0.1", 0), data, compute)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/", asked
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
