"""Shared test set-up: hypothesis profiles (CI is derandomized, with no deadline), the
GPT steps fixture, one cached run of each lesson file, the demo's page, and a direct launch
of the demo's tiny scenarios."""

import contextlib
import functools
import io
import os
import pickle
import runpy
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=15, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.register_profile("thorough", deadline=None, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# A lesson test may rerun a lesson in this process (runpy) for a variable that does not
# pickle (LessonNames below): there, figures would be drawn beside the lesson and cost a
# second or so each. No figures in this process and its children, unless a test asks
# (the run_lesson fixture below gives each lesson's script run a directory of its own, and
# the notebook tests and tests/viz/test_figures.py set their own).
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
    processor (user + system) and wall seconds its process took, the directory its
    figures went to ($MINIPAR_FIGURES: empty, or absent, if it drew none), and the file
    holding its variables (`names`)."""

    returncode: int
    stdout: str
    stderr: str
    cpu: float
    wall: float
    figures: Path
    variables: Path
    lesson: str  # the lesson file's path

    @functools.cached_property
    def names(self) -> "LessonNames":
        """The lesson's variables after it ran: those that pickle, and the others (its
        functions, a launch's result, which holds the runtime's locks) from a run of the
        lesson in this process, made the first time a test asks for one of them."""
        out = LessonNames(self.lesson)
        for name, blob in pickle.loads(self.variables.read_bytes()).items():
            try:
                out[name] = pickle.loads(blob)
            except Exception:  # pickled, but does not load (e.g. ml_dtypes' finfo)
                pass
        return out


class LessonNames(dict):
    """A lesson's variables; a name missing from the pickle runs the lesson here, once."""

    def __init__(self, lesson: str):
        super().__init__()
        self.lesson, self.rerun = lesson, False

    def __missing__(self, name):
        if self.rerun:
            raise KeyError(name)
        self.rerun = True
        with contextlib.redirect_stdout(io.StringIO()):
            self.update(runpy.run_path(self.lesson, run_name="__main__"))
        return self[name]


# Run a lesson as `python lesson.py` runs it (runpy, as __main__), then keep its variables:
# each pickled alone, so that one that does not pickle (a function of the lesson's) is
# left out, not the lot. The processor time is the process's until the lesson ended.
RUN = """import pickle, resource, runpy, sys
names = runpy.run_path(sys.argv[1], run_name="__main__")
usage = resource.getrusage(resource.RUSAGE_SELF)
kept = {}
for name, value in names.items():
    if not name.startswith("__"):
        try:
            kept[name] = pickle.dumps(value)
        except Exception:
            pass
with open(sys.argv[2], "wb") as f:
    pickle.dump(kept, f)
print(usage.ru_utime + usage.ru_stime, file=sys.stderr)
"""


def _run_lesson(path: str, figures: Path) -> LessonRun:
    """Run a lesson file as a script, its figures written to `figures`."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root), MPLBACKEND="Agg", MINIPAR_FIGURES=str(figures))
    variables = figures.with_suffix(".pickle")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", RUN, path, str(variables)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=60)
    wall = time.perf_counter() - start
    lines = proc.stderr.rstrip().splitlines()
    cpu = float(lines[-1]) if proc.returncode == 0 and lines else float("nan")
    stderr = "\n".join(lines[:-1]) if proc.returncode == 0 else proc.stderr
    return LessonRun(proc.returncode, proc.stdout, stderr, cpu, wall, figures, variables, path)


@pytest.fixture(scope="session")
def run_lesson(tmp_path_factory, worker_id):
    """run_lesson(path) -> LessonRun: each lesson file run once for the whole test run (a
    lesson takes 3-8 s, and tests in several xdist workers read its output, time, figures
    and variables: the first to ask runs it, under a lock, and the others read what it
    left), its figures in a directory of the run's (one per lesson), not beside the lesson."""
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
                saved.write_text(json.dumps({k: str(v) if isinstance(v, Path) else v
                                             for k, v in done.__dict__.items()}),
                                 encoding="utf-8")
            data = json.loads(saved.read_text(encoding="utf-8"))
        return LessonRun(**{**data, "figures": Path(data["figures"]),
                            "variables": Path(data["variables"])})
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
