"""Every bad input minipar is known to meet, and what it must answer: a clear error that names
the fix, never a traceback from deep inside, a hang, or a wrong result.

One table per area. A CLI case is (argv, words the error must contain): the command must exit
with argparse's status 2 (or the documented status) and print no traceback. A library case
is (id, a function that misuses minipar, the exception type, words its message must contain).
Each case failed (crashed, hung or answered wrongly) before the hardening issue.
"""

from __future__ import annotations

import concurrent.futures
import time

import numpy as np
import pytest

import minipar as mp  # noqa: F401  (the cases below use it)
from minipar.parallel.mesh import ParallelDims, ParallelGroups

# ---- the command line --------------------------------------------------------------------
CLI_CASES: list[tuple[list[str], list[str]]] = [
    # (argv after `minipar`, words the message must contain)
    # tour: a size the collectives cannot take, a timeline that cannot be drawn, a trace
    # that cannot be written -- before, a traceback after minutes of work, a MemoryError, a
    # hang, or nothing written without a word
    (["tour", "--megabytes", "nan"], ["--megabytes", "positive number of MiB", "nan"]),
    (["tour", "--megabytes", "inf"], ["--megabytes", "positive number of MiB", "inf"]),
    (["tour", "--megabytes", "-1"], ["--megabytes", "positive number of MiB"]),
    (["tour", "--megabytes", "1e12"], ["--megabytes", "at most 64 MiB", "80 copies"]),
    (["tour", "--width", "0"], ["--width", "positive number of columns", "0"]),
    (["tour", "--width", "-3"], ["--width", "positive number of columns"]),
    (["tour", "--width", "100000000"], ["--width", "at most 1,000 columns"]),
    (["tour", "--trace", ""], ["--trace", "empty"]),
    (["tour", "--trace", "/nonexistent-minipar-dir/t.json"], ["--trace", "no directory"]),
    (["tour", "--trace", "."], ["--trace", "is a directory", "trace.json"]),
    # grade and lessons: '' was lesson 00, a file that is not Python a traceback, the
    # wrong count of lessons exit status 1, flags that do nothing silently ignored
    (["grade", ""], ["NN", "lesson number such as 01"]),
    (["grade", "00", "--impl", "README.md"], ["--impl", "exercise, solution", ".py"]),
    (["grade", "00", "--impl", ""], ["--impl", "exercise, solution", ".py"]),
    (["lessons", "open", ""], ["NN", "lesson number such as 01"]),
    (["lessons", "open"], ["open takes one lesson number", "got 0"]),
    (["lessons", "open", "01", "02"], ["open takes one lesson number", "got 2"]),
    (["lessons", "list", "01"], ["list takes no lesson number", "lessons open NN"]),
    (["lessons", "--check"], ["--check and --force", "build"]),
    (["lessons", "--force"], ["--check and --force", "build"]),
    (["lessons", "build", "--check", "--force"], ["--check only compares", "--force"]),
    (["lessons", "corpus", "--check"], ["--check and --force", "build"]),
    (["grade", "00", "--time-limit", "0"], ["--time-limit", "positive number of seconds"]),
    (["grade", "00", "--time-limit", "nan"], ["--time-limit", "positive number of seconds"]),
    (["grade", "00", "--time-limit", "soon"], ["--time-limit", "positive number of seconds",
                                               "'soon'"]),
    # train: runs that cannot end (10^20 steps ran for ever; so did 10^12 characters)
    (["train", "--steps", "99999999999999999999"], ["--steps", "at most 1,000,000"]),
    (["train", "--sample", "1000000000000"], ["--sample", "at most 100,000"]),
    # train --pp: pipelines the schedule or the split cannot run, flags that would do nothing
    (["train", "--pp", "3", "--layers", "2"], ["--pp 3 x --chunks 1 = 3 stages", "--layers",
                                               "got 2"]),
    (["train", "--pp", "2", "--schedule", "zb"], ["--schedule", "invalid choice: 'zb'"]),
    (["train", "--pp", "2", "--schedule", "interleaved_1f1b", "--micro-batches", "3",
      "--batch", "12"], ["--micro-batches must be a multiple of --pp 2", "got 3"]),
    (["train", "--pp", "2", "--chunks", "2"], ["--chunks 2", "--schedule interleaved_1f1b"]),
    (["train", "--schedule", "gpipe"], ["--schedule and --chunks shape a pipeline",
                                        "--pp N"]),
    (["train", "--pp", "2", "--dtype", "float16"], ["loss scaling", "--dtype bfloat16"]),
    (["train", "--pp", "1000"], ["--pp", "at most 64"]),
]


# ---- the runtime: launch, groups, collectives, sends --------------------------------------
def _ring_of_blocking_sends(ctx):
    r, n = ctx.rank, ctx.world_size
    mp.send(np.ones(2), dst=(r + 1) % n)
    return mp.recv(src=(r - 1) % n)


def _isend_nobody_receives(ctx):
    if ctx.rank == 0:
        mp.isend(np.ones(2), dst=1)


def _one_rank_sleeps(ctx):
    if ctx.rank == 1:
        time.sleep(0.6)  # outside minipar, longer than the timeout
        return None
    return mp.all_reduce(np.ones(2))


def _wait_times_out(ctx):
    if ctx.rank == 1:
        time.sleep(0.4)
        return None
    return mp.irecv(src=1).wait(timeout=0.1)


def _two_ranks_fail(ctx):
    if ctx.rank == 1:
        time.sleep(0.1)  # fails later in time, but is the lower rank
        raise ValueError("the lower rank's own failure")
    if ctx.rank == 2:
        raise KeyError("first in time")
    mp.barrier()


RUNTIME_CASES: list[tuple[str, object, type, list[str]]] = [
    # (id, fn() that misuses the runtime, exception type, words in its message)
    ("runtime:all_reduce-from-a-thread-the-rank-started",
     lambda: _in_worker(lambda: mp.all_reduce(np.ones(2))), mp.RankThreadError,
     ["all_reduce was called from thread", "not a rank", "join it"]),
    ("runtime:send-from-a-thread-the-rank-started",
     lambda: _in_worker(lambda: mp.send(np.ones(2), 1) if mp.get_rank() == 0 else None),
     mp.RankThreadError, ["get_rank was called from thread", "not a rank"]),
    ("runtime:all_reduce-of-strings",
     lambda: _on(2, lambda c: mp.all_reduce(np.array(["a", "b"]))), mp.CollectiveUsageError,
     ["all_reduce on group world[0, 1]", "dtype <U1", "cannot be reduced"]),
    ("runtime:reduce_scatter-of-records",
     lambda: _on(2, lambda c: mp.reduce_scatter(np.zeros(2, dtype=[("a", "f4")]))),
     mp.CollectiveUsageError, ["reduce_scatter", "cannot be reduced", "need numbers"]),
    ("runtime:reduce-of-dates",
     lambda: _on(2, lambda c: mp.reduce(np.array(["2024-01-01"], dtype="M8[D]"), dst=0)),
     mp.CollectiveUsageError, ["reduce on group", "datetime64[D]", "cannot be reduced"]),
    ("runtime:all_reduce-of-python-objects",
     lambda: _on(2, lambda c: mp.all_reduce(np.array([{}, 1], dtype=object))),
     mp.CollectiveUsageError, ["rank 0: all_reduce", "Python objects"]),
    ("runtime:all_gather-of-python-objects",
     lambda: _on(2, lambda c: mp.all_gather(np.array([[1], None], dtype=object))),
     mp.CollectiveUsageError, ["all_gather", "Python objects", "numeric dtype"]),
    ("runtime:all_reduce-of-a-ragged-list",
     lambda: _on(2, lambda c: mp.all_reduce([[1.0, 2.0], [3.0]])), mp.CollectiveUsageError,
     ["rank 0: all_reduce needs a rectangular array", "pad"]),
    ("runtime:send-of-a-ragged-list",
     lambda: _on(2, lambda c: mp.send([[1], [2, 3]], 1) if c.rank == 0 else mp.recv(0)),
     mp.CollectiveUsageError, ["rank 0: send needs a rectangular array"]),
    ("runtime:all_to_all-of-None",
     lambda: _on(2, lambda c: mp.all_to_all(None)), mp.CollectiveUsageError,
     ["all_to_all on group world[0, 1] needs a list of 2 pieces", "NoneType"]),
    ("runtime:group-made-in-a-launch-of-4-used-in-a-launch-of-2",
     lambda: _on(2, lambda c: mp.all_reduce(np.ones(1), group=_group_of_launch(4))),
     mp.CollectiveUsageError, ["ranks [2, 3] do not exist in this world of 2 ranks",
                               "made in a world of 4 ranks", "inside the program"]),
    ("runtime:recv-on-a-group-made-in-another-launch",
     lambda: _on(2, lambda c: mp.recv(3, group=_group_of_launch(4))),
     mp.CollectiveUsageError, ["recv on group", "do not exist in this world of 2 ranks"]),
    ("runtime:group-is-a-string",
     lambda: _on(2, lambda c: mp.all_reduce(np.ones(1), group="tp")), mp.CollectiveUsageError,
     ["group='tp' (str)", "pass a ProcessGroup"]),
    ("runtime:group-is-a-list-of-ranks",
     lambda: _on(2, lambda c: mp.barrier(group=[0, 1])), mp.CollectiveUsageError,
     ["barrier got group=[0, 1] (list)", "mp.new_group"]),
    ("runtime:broadcast-src-is-a-bool",
     lambda: _on(2, lambda c: mp.broadcast(np.ones(1), src=True)), mp.CollectiveUsageError,
     ["src=True (bool)", "global rank"]),
    ("runtime:all_gather-axis-is-a-string",
     lambda: _on(2, lambda c: mp.all_gather(np.ones(2), axis="0")), mp.CollectiveUsageError,
     ["axis='0' (str)", "axis is an int"]),
    ("runtime:all_to_all_single-fractional-splits",
     lambda: _on(2, lambda c: mp.all_to_all_single(np.ones(4), [1.5, 2.5])),
     mp.CollectiveUsageError, ["input_split_sizes", "whole number", "1.5"]),
    ("runtime:new_group-with-a-fractional-rank",
     lambda: _on(2, lambda c: mp.new_group([0, 1.5])), mp.RankFailedError,
     ["new_group([0, 1.5])", "whole number", "got 1.5"]),
    ("runtime:new_group-with-a-bool-rank",
     lambda: _on(2, lambda c: mp.new_group([False, True])), mp.RankFailedError,
     ["new_group([False, True])", "bool"]),
    ("runtime:new_group-of-a-string",
     lambda: _on(2, lambda c: mp.new_group("01")), mp.RankFailedError,
     ["list of global ranks", "str '01'"]),
    ("runtime:new_group-of-an-int",
     lambda: _on(2, lambda c: mp.new_group(2)), mp.RankFailedError,
     ["list of global ranks like [0, 1]", "int 2"]),
    ("runtime:new_group-named-by-an-int",
     lambda: _on(2, lambda c: mp.new_group([0, 1], name=3)), mp.RankFailedError,
     ["name is a string", "int 3"]),
    ("topology:nodes-2-gpus-2.5",
     lambda: mp.Topology.nodes(2, 2.5), ValueError,
     ["Topology(gpus_per_node=2.5)", "whole number >= 1"]),
    ("topology:nodes-nan",
     lambda: mp.Topology.nodes(float("nan"), 8), ValueError, ["num_nodes=nan", "whole number"]),
    ("topology:nodes-bool",
     lambda: mp.Topology.nodes(True, 8), TypeError, ["num_nodes=True", "bool"]),
    ("topology:nodes-string",
     lambda: mp.Topology.nodes("2", 8), TypeError, ["num_nodes='2'", "whole number"]),
    ("topology:device-is-a-string",
     lambda: mp.Topology.nodes(1, 2, device="h100"), TypeError,
     ["Topology(device=...) takes a DeviceSpec", "DeviceSpec.h100_sxm()"]),
    ("topology:inter-link-is-a-string",
     lambda: mp.Topology.nodes(2, 2, inter="ib"), TypeError,
     ["Topology(inter=...) takes a Link", "Link.infiniband_ndr()"]),
    ("topology:link-of-zero-bandwidth",
     lambda: mp.Link("slow", 0, 1e-6), ValueError, ["Link 'slow' bandwidth", "> 0", "got 0"]),
    ("topology:link-of-negative-bandwidth",
     lambda: mp.Link("slow", -1e9, 1e-6), ValueError, ["bandwidth (bytes/s)", "> 0"]),
    ("topology:link-of-nan-latency",
     lambda: mp.Link("odd", 1e9, float("nan")), ValueError, ["latency (seconds)", ">= 0"]),
    ("topology:link-of-infinite-bandwidth",
     lambda: mp.Link("ideal", float("inf"), 0.0), ValueError, ["finite number > 0", "inf"]),
    ("topology:device-with-negative-memory",
     lambda: mp.DeviceSpec.h100_sxm().with_memory(-1), ValueError,
     ["memory_bytes", "whole number >= 1", "got -1"]),
    ("topology:device-with-fractional-memory",
     lambda: mp.DeviceSpec.h100_sxm().with_memory(2.5), ValueError,
     ["memory_bytes", "got 2.5"]),
    ("topology:device-with-zero-peak",
     lambda: mp.DeviceSpec("toy", {"float32": 0.0}, 10**9), ValueError,
     ["peak_flops['float32']", "> 0"]),
    ("topology:device-with-nan-peak",
     lambda: mp.DeviceSpec("toy", {"float32": float("nan")}, 10**9), ValueError,
     ["peak_flops['float32'] (FLOP/s)", "finite"]),
    ("mesh:fractional-dimension",
     lambda: mp.DeviceMesh((2.5, 2), ("dp", "tp")), ValueError,
     ["mesh dimension 0 of shape (2.5, 2)", "whole number"]),
    ("mesh:bool-dimension",
     lambda: mp.DeviceMesh((True, 2), ("dp", "tp")), TypeError, ["mesh dimension 0", "bool"]),
    ("mesh:names-as-one-string",
     lambda: mp.DeviceMesh((2, 2), "ab"), TypeError, ["mesh_dim_names", "tuple of strings"]),
    ("mesh:shape-is-an-int",
     lambda: mp.DeviceMesh(4, ("dp",)), TypeError, ["mesh shape is a tuple of sizes", "int 4"]),
    ("mesh:10^14-ranks",
     lambda: mp.DeviceMesh((10**7, 10**7), ("dp", "tp")), ValueError,
     ["covers 100000000000000 ranks", "typo"]),
    ("mesh:init_device_mesh-fractional-dimension",
     lambda: _on(4, lambda c: mp.init_device_mesh((2.5, 2), ("dp", "tp"))), mp.RankFailedError,
     ["mesh dimension 0 of shape (2.5, 2)"]),
    ("mesh:coordinate-of-a-rank-outside",
     lambda: mp.DeviceMesh((2, 2), ("dp", "tp")).coordinate(7), ValueError,
     ["rank 7 is not in this mesh of 4 ranks", "0..3"]),
    ("mesh:ParallelDims-of-10^8-ranks",
     lambda: ParallelDims(dp_shard=10**8, ep=3), ValueError,
     ["covers 100000000 ranks", "typo"]),
    ("mesh:ParallelGroups-rank-outside-the-world",
     lambda: _on(2, lambda c: _parallel_groups(tp=2, rank=5)), mp.RankFailedError,
     ["ParallelGroups(rank=5)", "0..1"]),
    ("mesh:ParallelGroups-rank-is-a-bool",
     lambda: _on(2, lambda c: _parallel_groups(tp=2, rank=True)), mp.RankFailedError,
     ["ParallelGroups(rank=True)"]),
    ("pipeline: pp does not divide the world",
     lambda: _on(4, lambda c: _pipeline(ParallelDims(pp=3), microbatches=3)),
     mp.RankFailedError, ["ParallelDims(pp=3) covers 3 ranks", "the world has 4"]),
    ("pipeline: more stages than layers",
     lambda: _on(4, lambda c: _pipeline(ParallelDims(pp=4), microbatches=4)),
     mp.RankFailedError, ["4 stages need at least 4 layers", "the model has 2"]),
    ("pipeline: unknown schedule",
     lambda: _on(2, lambda c: _pipeline(ParallelDims(pp=2), schedule="zb", microbatches=2)),
     mp.RankFailedError, ["unknown schedule 'zb'", "'gpipe', '1f1b', 'interleaved_1f1b'"]),
    ("pipeline: interleaved with m not a multiple of pp",
     lambda: _on(2, lambda c: _pipeline(ParallelDims(pp=2), schedule="interleaved_1f1b",
                                        chunks=2, microbatches=3, num_layers=4)),
     mp.RankFailedError, ["multiple of pp = 2, got 3", "microbatches = 2 or 4"]),
    ("pipeline: chunks without the interleaved schedule",
     lambda: _on(2, lambda c: _pipeline(ParallelDims(pp=2), schedule="1f1b", chunks=2,
                                        microbatches=2, num_layers=4)),
     mp.RankFailedError, ["'1f1b' runs one stage per rank, got chunks=2",
                          "'interleaved_1f1b'"]),
    ("pipeline: no micro-batches",
     lambda: _on(2, lambda c: _pipeline(ParallelDims(pp=2))), mp.RankFailedError,
     ["a pipeline of pp = 2 needs microbatches=m"]),
    ("pipeline: layers without a pipeline",
     lambda: _on(1, lambda c: _pipeline(ParallelDims(), layers=[1, 1])), mp.RankFailedError,
     ["layers=[1, 1] splits the blocks among pipeline stages", "runs no pipeline"]),
    ("pipeline: a tied wte in two units of one rank under ZeRO-3",
     lambda: _on(1, lambda c: _pipeline(ParallelDims(), schedule="interleaved_1f1b",
                                        chunks=2, microbatches=1, zero=3,
                                        tie_embeddings=True)),
     mp.RankFailedError, ["stages 0 and 1 on one pipeline rank both use wte", "zero=3",
                          "tie_embeddings=False"]),
    ("pipeline: a train step with other micro-batches than the schedule's",
     lambda: _on(2, lambda c: _pipeline(ParallelDims(pp=2), microbatches=2).train_step(
         np.zeros((4, 4), int), np.zeros((4, 4), int), micro_batches=4)),
     mp.RankFailedError, ["runs m = 2 micro-batches", "got micro_batches=4"]),
    ("pipeline: a dp block of each micro-batch with a model that draws the whole batch",
     lambda: _on(1, lambda c: _runner_of_a_plain_gpt()), mp.RankFailedError,
     ["runs block 0 of 2 of each micro-batch", "batch_shard=(0, 2)"]),
    ("ledger:negative-capacity",
     lambda: mp.MemoryLedger(capacity=-1), ValueError, ["capacity", ">= 0", "got -1"]),
    ("ledger:nan-capacity",
     lambda: mp.MemoryLedger(capacity=float("nan")), ValueError, ["capacity", "got nan"]),
    ("ledger:infinite-capacity",
     lambda: mp.MemoryLedger(capacity=float("inf")), ValueError, ["None for no limit"]),
    ("ledger:hold-a-string",
     lambda: mp.MemoryLedger(100).hold("w", "100"), TypeError,
     ["array or a number of bytes", "str '100'"]),
    ("ledger:hold-None",
     lambda: mp.MemoryLedger(100).hold("w", None), TypeError, ["number of bytes", "None"]),
    ("ledger:hold-a-bool",
     lambda: mp.MemoryLedger(100).hold("w", True), TypeError, ["number of bytes", "bool"]),
    ("sends: a ring of blocking sends before recvs",
     lambda: mp.launch(_ring_of_blocking_sends, 3), mp.DeadlockError,
     ["rank 0: waiting in send(dst=1", "rank 2: waiting in send(dst=0",
      "send blocks until the receiver posts its recv", "alternate by parity"]),
    ("sends: an isend nobody receives",
     lambda: mp.launch(_isend_nobody_receives, 2), mp.DeadlockError,
     ["rank 0: waiting in the end of its program", "send(dst=1, tag=0)",
      "rank 1: finished"]),
    ("sends: unknown mode", lambda: mp.launch(lambda ctx: None, 2, sends="buffered"),
     ValueError, ["sends='buffered'", "'rendezvous'", "'eager'"]),
    ("timeout: a rank sleeps outside minipar while the others wait",
     lambda: mp.launch(_one_rank_sleeps, 3, timeout=0.2), mp.CollectiveTimeoutError,
     ["rank 1: never arrived", "rank 0: waiting in all_reduce", "not yet arrived: [1]",
      "Ranks that never arrived: [1]"]),
    ("timeout: Work.wait(timeout=) on a recv nobody sends in time",
     lambda: mp.launch(_wait_times_out, 2), mp.CollectiveTimeoutError,
     ["rank 0: Work.wait(timeout=0.1) expired", "recv(src=1, tag=0)"]),
    ("timeout: zero", lambda: mp.launch(lambda ctx: None, 2, timeout=0), ValueError,
     ["timeout=...) got 0", "positive, finite number of seconds"]),
    ("timeout: nan", lambda: mp.launch(lambda ctx: None, 2, timeout=float("nan")),
     ValueError, ["got nan", "pass None for no timeout"]),
    ("timeout: a string", lambda: mp.launch(lambda ctx: None, 2, timeout="10"), ValueError,
     ["got '10'"]),
    ("timeout: Work.wait(timeout=-1)",
     lambda: mp.launch(lambda ctx: mp.all_reduce(np.ones(1), async_op=True).wait(timeout=-1),
                       2), ValueError, ["Work.wait(timeout=...) got -1"]),
    ("timeout: under the mpi backend",
     lambda: mp.launch(lambda ctx: None, 2, backend="mpi", timeout=5), ValueError,
     ["simulated backend's watchdog", "MPIEXEC_TIMEOUT"]),
    ("launch: several ranks fail, the lowest rank is reported",
     lambda: mp.launch(_two_ranks_fail, 4), mp.RankFailedError,
     ["the lower rank's own failure"]),
    ("launch: fn is not callable", lambda: mp.launch(42, 2), TypeError,
     ["needs a function of the rank's context", "got int 42"]),
    ("launch: topology is not a Topology", lambda: mp.launch(lambda ctx: None, 2, topology=2),
     TypeError, ["topology must be a minipar Topology", "got int 2"]),
    ("launch: world_size=True", lambda: mp.launch(lambda ctx: None, True), ValueError,
     ["world_size must be a positive integer, got True"]),
]


# ---- the model, the optimizers and `minipar train` -----------------------------------------
def _train(**kw):
    from minipar.programs.train import TrainConfig, train
    return train(TrainConfig(**kw))


def _gpt(**kw):
    from minipar.nn import GPTConfig
    return GPTConfig(**kw)


def _block_segments():
    """A Block told to recompute in "segments": a model's mode, not a block's."""
    from minipar.nn import GPTConfig
    from minipar.nn.block import Block
    with mp.device():
        return Block("blocks.0", GPTConfig(), recompute="segments")


def _segment_records_of_another_range():
    """blocks_backward(0, 4) handed the segment records of blocks_forward(0, 2)."""
    import numpy as np
    from minipar.nn import GPT, GPTConfig
    cfg = GPTConfig(vocab_size=8, seq_len=4, hidden=8, num_heads=2, num_layers=4,
                    recompute="segments", recompute_segment=2)
    with mp.device():
        model = GPT(cfg)
        x = np.zeros((4, 1, 8))
        _, saved = model.blocks_forward(x, np.random.default_rng(0), 0, 2)
        return model.blocks_backward(x, saved, 0, 4)


def _clip_coef(total, max_norm):
    from minipar.optim import clip_coef
    return clip_coef(total, max_norm)


def _clipped(grad, max_norm=1.0):
    """clip_grad_norm_ on one parameter; raises (as the table wants) only if the gradient
    is what torch.nn.utils.clip_grad_norm_ leaves: g * clamp(max_norm / (norm + 1e-6), 1)."""
    import math
    import numpy as np
    from minipar.nn.parameter import Parameter
    from minipar.optim import clip_grad_norm_
    g = np.array(grad, dtype=np.float64)
    coef = max_norm / (math.sqrt(float(np.sum(g * g))) + 1e-6)
    coef = coef if math.isnan(coef) else min(1.0, coef)
    with np.errstate(invalid="ignore"):
        torch_result = g * coef
    with mp.device():
        p = Parameter("p", np.zeros(len(grad)))
        p.accumulate(g.copy())
        norm = clip_grad_norm_([p], max_norm)
    if np.array_equal(p.grad, torch_result, equal_nan=True):
        raise FloatingPointError(f"clipped as torch does: norm {norm}, grad {p.grad}")
    return p.grad


def _dropout_repeats():
    """Two forwards without a generator: the same masks would be the old, wrong answer."""
    import numpy as np
    from minipar.nn import GPT, GPTConfig
    from minipar.nn.saved import release_all
    cfg = GPTConfig(vocab_size=8, seq_len=4, hidden=8, num_heads=2, num_layers=1,
                    dropout=0.5)
    with mp.device():
        model = GPT(cfg)
        ids = np.arange(8).reshape(4, 2)
        masks = []
        for _ in range(2):
            _, cache = model.forward(ids, ids)
            masks.append(cache.embed.dropout.mask.copy())
            release_all(cache)
    if np.array_equal(*masks):
        return masks
    raise LookupError("fresh masks: step 2 differs from step 1")


MODEL_CASES: list[tuple[str, object, type, list[str]]] = [
    ("train:memory-over-the-device", lambda: _train(hidden=16384, num_heads=128,
                                                    num_layers=48, seq_len=2048),
     ValueError, ["needs about", "holds", "attention scores", "--micro-batches"]),
    ("train:hidden-1", lambda: _train(hidden=1, num_heads=1), ValueError,
     ["hidden = 1 cannot learn", "LayerNorm", "constant"]),
    ("train:one-step-all-warmup", lambda: _train(steps=1, warmup_steps=1), ValueError,
     ["lr 0", "warmup_steps = 0"]),
    ("train:nan-loss-float32", lambda: _train(steps=20, global_batch=8, seq_len=16,
                                              num_layers=1, hidden=32, num_heads=2, lr=1e4,
                                              min_lr=0.0, warmup_steps=3),
     FloatingPointError, ["loss became nan at step 7", "learning rate"]),
    ("train:nan-loss-float16", lambda: _train(steps=20, global_batch=8, seq_len=16,
                                              num_layers=1, hidden=32, num_heads=2, lr=1e4,
                                              min_lr=0.0, warmup_steps=3, dtype="float16"),
     FloatingPointError, ["loss became nan at step 3", "float16", "loss scale"]),
    ("config:init_std-nan", lambda: _gpt(init_std=float("nan")), ValueError,
     ["init_std must be a finite number > 0", "nan"]),
    ("config:init_std-inf", lambda: _gpt(init_std=float("inf")), ValueError,
     ["init_std must be a finite number > 0"]),
    ("config:layernorm_eps-0", lambda: _gpt(layernorm_eps=0.0), ValueError,
     ["layernorm_eps must be a finite number > 0"]),
    ("config:layernorm_eps-nan", lambda: _gpt(layernorm_eps=float("nan")), ValueError,
     ["layernorm_eps"]),
    ("config:dropout-string", lambda: _gpt(dropout="0.1"), ValueError,
     ["dropout must be in [0, 1)", "'0.1'"]),
    ("config:hidden-bool", lambda: _gpt(hidden=True, num_heads=1), ValueError,
     ["hidden must be a positive integer", "True"]),
    ("config:vocab_size-bool", lambda: _gpt(vocab_size=True), ValueError,
     ["vocab_size must be a positive integer"]),
    ("config:recompute_segment-bool", lambda: _gpt(recompute="segments",
                                                   recompute_segment=True), ValueError,
     ["recompute_segment must be a positive integer", "True"]),
    ("config:recompute_segment-0", lambda: _gpt(recompute="segments", recompute_segment=0),
     ValueError, ["recompute_segment must be a positive integer", "got 0"]),
    ("config:recompute_segment-float", lambda: _gpt(recompute="segments",
                                                    recompute_segment=2.0), ValueError,
     ["recompute_segment must be a positive integer", "2.0"]),
    ("config:recompute_segment-without-segments", lambda: _gpt(recompute="full",
                                                               recompute_segment=2),
     ValueError, ["recompute_segment=2 sizes checkpoint segments", "recompute='full'",
                  "set recompute='segments'"]),
    ("config:recompute-segments-in-a-block", _block_segments, ValueError,
     ["a block recomputes in mode 'none', 'selective' or 'full'", "GPTConfig(recompute="
      "'segments')"]),
    ("model:segment-records-of-another-range", _segment_records_of_another_range,
     ValueError, ["checkpoint segments [(0, 2), (2, 4)]", "got records for [(0, 2)]",
                  "pass the same lo and hi"]),
    ("config:ffn_hidden-float", lambda: _gpt(ffn_hidden=2.5), ValueError,
     ["ffn_hidden must be a positive integer", "2.5"]),
    ("config:seed-negative", lambda: _gpt(seed=-1), ValueError,
     ["seed must be an integer >= 0"]),
    ("config:seed-float", lambda: _gpt(seed=1.5), ValueError, ["seed must be an integer"]),
    ("config:dtype-int8-type", lambda: _gpt(dtype=__import__("numpy").int8), ValueError,
     ["dtype must be one of", "floating point"]),
    ("config:dtype-None", lambda: _gpt(dtype=None), ValueError, ["dtype must be one of"]),
    ("config:tie_embeddings-string", lambda: _gpt(tie_embeddings="yes"), ValueError,
     ["tie_embeddings must be True or False"]),
    ("clip:inf-norm-zeroes-as-torch", lambda: _clipped([1.0, float("inf"), 3.0]),
     FloatingPointError, ["clipped as torch does", "norm inf"]),
    ("clip:nan-norm-poisons-as-torch", lambda: _clipped([1.0, float("nan")]),
     FloatingPointError, ["clipped as torch does", "norm nan"]),
    ("clip:max_norm-nan", lambda: _clip_coef(1.0, float("nan")), ValueError,
     ["max_norm must be > 0"]),
    ("dropout:fresh-masks-every-forward", _dropout_repeats, LookupError, ["fresh masks"]),
]


# ---- checkpoints and files ----------------------------------------------------------------
import minipar.files  # noqa: E402  (mp.files, for the cases below; helpers after the table)

CHECKPOINT_CASES: list[tuple[str, object, type, list[str]]] = [
    ("checkpoint: a pipeline rank's engine saved without its groups",
     lambda: _on(2, lambda c: _save_engine_alone()), mp.files.CheckpointError,
     ["holds one pipeline rank's stages", "pass parallelize's run"]),
    ("files: a 236-byte .npz whose header declares 128 GiB", lambda: _load("huge"),
     mp.files.CheckpointError, ["declares float64 of shape [17179869184]", "holds 0",
                                "before anything is allocated"]),
    ("files: a member whose CRC-32 fails", lambda: _load("crc"),
     mp.files.CheckpointError, ["array 'w' (member 'w.npy') is damaged", "Bad CRC-32"]),
    ("files: a member whose middle is lost", lambda: _load("middle"),
     mp.files.CheckpointError, ["array 'w' (member 'w.npy') is damaged"]),
    ("files: a member holding 40 of the 48 bytes its header declares", lambda: _load("short"),
     mp.files.CheckpointError, ["48 bytes of data, but holds 40"]),
    ("files: a member header with a negative shape", lambda: _load("negative"),
     mp.files.CheckpointError, ["declares the shape [-2, 3], with a negative size"]),
    ("files: a zip directory placing a member beyond the file's end",
     lambda: _load("zip", 8, 1 << 30), mp.files.CheckpointError, ["beyond the file's"]),
    ("files: a stored member declaring 1 GiB in 176 bytes", lambda: _load("zip", 9, 1 << 30),
     mp.files.CheckpointError, ["stored uncompressed but declares 1073741824 bytes"]),
    ("files: a deflated member declaring more than deflate's ratio",
     lambda: _load("zip", 9, 1 << 31, method=8), mp.files.CheckpointError,
     ["more than deflate's largest ratio (1032:1)"]),
    ("files: a member in an unknown zip compression method",
     lambda: _load("zip", 4, 12), mp.files.CheckpointError, ["compression method 12"]),
    ("files: an .npz listing one member twice", lambda: _load("twice"),
     mp.files.CheckpointError, ["lists member 'w.npy' twice"]),
    ("files: a .json without its meta table", lambda: _load("no meta"),
     mp.files.CheckpointError, ["has no 'arrays' or 'meta' table"]),
    ("files: a .json array entry that is not a table", lambda: _load("entry"),
     mp.files.CheckpointError, ["the entry of array 'w' is [2, 3]"]),
    ("files: a .json nested 100 000 deep", lambda: _load("deep"),
     mp.files.CheckpointError, ["is not valid JSON"]),
    ("files: save_arrays onto a directory named x.npz", lambda: _save("onto dir"),
     mp.files.CheckpointError, ["x.npz: it is a directory"]),
    ("files: save_arrays under a path that is a file", lambda: _save("under file"),
     mp.files.CheckpointError, ["is a file, not a directory"]),
    ("files: save_sharded into a path that is a file", lambda: _save("sharded onto file"),
     mp.files.CheckpointError, ["it is a file, and a sharded checkpoint is a directory"]),
    ("files: save_sharded with a save_id that is not a string", lambda: _save("save_id"),
     mp.files.CheckpointError, ["save_id must be a str"]),
    ("files: a sharded directory mixing two saves of the same shapes", lambda: _sharded("mix"),
     mp.files.CheckpointError, ["belongs to save 'b'", "mixes files of two saves"]),
    ("files: a sharded index declaring 10**12 ranks", lambda: _sharded("world"),
     mp.files.CheckpointError, ["index.json is damaged: expected world_size >= 1"]),
    ("files: a sharded index whose global_numel is a string", lambda: _sharded("numel"),
     mp.files.CheckpointError, ["the entry of array 'x' is damaged"]),
    ("files: a sharded index whose offsets disagree with shard_numel",
     lambda: _sharded("offsets"), mp.files.CheckpointError,
     ["the entry of array 'x' is damaged", "offsets r * shard_numel"]),
    ("checkpoint: rank files without index.json (an unfinished save)",
     lambda: _layout("no index"), mp.files.CheckpointError,
     ["holds rank files but no index.json: the save did not finish"]),
    ("checkpoint: an index whose step is a string", lambda: _layout("step"),
     mp.files.CheckpointError, ["metadata is damaged", "step: an int >= 0"]),
    ("checkpoint: an index whose mesh declares 10**9 dp_shard ranks", lambda: _layout("mesh"),
     mp.files.CheckpointError, ["one file per coordinate of the mesh"]),
    ("checkpoint: tensor-parallel pieces that cannot join", lambda: _layout("pieces"),
     mp.files.CheckpointError, ["tensor-parallel pieces have shapes [[128], [128]]",
                                "do not join along dimension 1"]),
    ("checkpoint: consolidated metadata whose params are not tables",
     lambda: _layout("consolidated params"), mp.files.CheckpointError,
     ["full.json: the checkpoint's metadata is damaged; expected params:"]),
    ("checkpoint: save_sharded into a path that is a file", lambda: _layout("save onto file"),
     mp.files.CheckpointError, ["it is a file, and a sharded checkpoint is a directory"]),
    ("checkpoint: save_consolidated onto a directory", lambda: _layout("save onto dir"),
     mp.files.CheckpointError, ["c.npz: it is a directory"]),
]


def _npy(shape, descr="<f8", data=b""):
    import io
    import numpy as np
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": tuple(shape)})
    return buf.getvalue() + data


def _edit_json(path, edit):
    import json
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _load(how, field=None, value=None, method=None):
    """A checkpoint pair w.npz/w.json of arange(6.0) damaged `how`, its .json recording the
    damaged .npz's sha256 (so the checks past it must refuse), then loaded."""
    import hashlib
    import struct
    import tempfile
    import zipfile
    from pathlib import Path
    import numpy as np
    base = Path(tempfile.mkdtemp()) / "w"
    mp.files.save_arrays(base, {"w": np.arange(6.0).reshape(2, 3)}, {})
    npz, js = mp.files.checkpoint_paths(base)
    raw = bytearray(npz.read_bytes())
    members = {"huge": [("w.npy", _npy([2 ** 34]))],
               "short": [("w.npy", _npy([2, 3], data=bytes(40)))],
               "negative": [("w.npy", _npy([-2, 3]))],
               "zip": [("w.npy", _npy([2, 3], data=bytes(48)))],
               "twice": [("w.npy", _npy([2, 3], data=bytes(48)))] * 2}
    if how in members:
        import warnings
        with warnings.catch_warnings(), zipfile.ZipFile(npz, "w") as zf:
            warnings.simplefilter("ignore")  # "Duplicate name"
            for name, data in members[how]:
                zf.writestr(name, data)
        raw = bytearray(npz.read_bytes())
    if how == "huge":
        _edit_json(js, lambda d: d["arrays"]["w"].update(shape=[2 ** 34]))
    elif how == "crc":
        raw[raw.index(b"\x93NUMPY") + 131] ^= 0xFF
    elif how == "middle":
        raw = raw[:len(raw) // 2] + raw[-120:]
    elif how == "zip":
        at = raw.rindex(b"PK\x01\x02")  # the central directory entry of the one member
        fields = list(struct.unpack_from("<4s6H3L5H2L", raw, at))
        fields[field] = value
        if method is not None:
            fields[4] = method
        struct.pack_into("<4s6H3L5H2L", raw, at, *fields)
    elif how == "no meta":
        _edit_json(js, lambda d: d.pop("meta"))
    elif how == "entry":
        _edit_json(js, lambda d: d["arrays"].update(w=[2, 3]))
    npz.write_bytes(bytes(raw))
    _edit_json(js, lambda d: d.update(npz_sha256=hashlib.sha256(bytes(raw)).hexdigest()))
    if how == "deep":
        js.write_text("[" * 100_000 + "]" * 100_000)
    mp.files.load_arrays(base)


def _save(how):
    import tempfile
    from pathlib import Path
    import numpy as np
    d = Path(tempfile.mkdtemp())
    (d / "x.npz").mkdir()
    (d / "file").write_text("a file")
    x = {"x": np.ones(2)}
    if how == "onto dir":
        mp.files.save_arrays(d / "x", x, {})
    elif how == "under file":
        mp.files.save_arrays(d / "file" / "c", x, {})
    elif how == "sharded onto file":
        mp.files.save_sharded(d / "file", 0, 1, x, {})
    else:
        mp.files.save_sharded(d / "s", 0, 1, x, {}, save_id=3)


def _sharded(how):
    """Two files.save_sharded saves "a" and "b" of the same shapes, "a" damaged `how`."""
    import tempfile
    from pathlib import Path
    import numpy as np
    d = Path(tempfile.mkdtemp())
    for save in ("a", "b"):
        for r in range(2):
            mp.files.save_sharded(d / save, r, 2, {"x": np.full(2, r), "step": np.array(1)},
                                  {}, sharded={"x": [4]}, save_id=save)
    if how == "mix":
        for suffix in (".npz", ".json"):
            (d / "a" / f"rank00001{suffix}").write_bytes(
                (d / "b" / f"rank00001{suffix}").read_bytes())
    edit = {"mix": lambda i: None, "world": lambda i: i.update(world_size=10 ** 12),
            "numel": lambda i: i["arrays"]["x"].update(global_numel="4"),
            "offsets": lambda i: i["arrays"]["x"].update(offsets=[0, 1])}[how]
    _edit_json(d / "a" / "index.json", edit)
    mp.files.consolidate(d / "a")


_LAYOUT_SAVE = []


def _layout(how):
    """A dp 2 x tp 2 ZeRO-1 save (made once), copied, damaged `how` and read back; or a
    save onto a bad path."""
    import shutil
    import tempfile
    from pathlib import Path
    import numpy as np
    from minipar.nn import GPT, GPTConfig
    from minipar.parallel import ParallelDims, checkpoint, parallelize, zero_engine
    cfg = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, num_layers=2,
                    ffn_hidden=32)
    d = Path(tempfile.mkdtemp())
    if how.startswith("save"):
        (d / "file").write_text("a file")
        (d / "c.npz").mkdir()
        with mp.device():
            engine = zero_engine(GPT(cfg), stage=0, lr=1e-2)
            if how == "save onto file":
                checkpoint.save_sharded(engine, d / "file")
            checkpoint.save_consolidated(engine, d / "c")
    if not _LAYOUT_SAVE:
        saved = Path(tempfile.mkdtemp())

        def program(ctx):
            run = parallelize(cfg, ParallelDims(dp_shard=2, tp=2), zero=1, lr=1e-2)
            checkpoint.save_sharded(run, saved / "sharded")
            checkpoint.save_consolidated(run, saved / "full")

        mp.launch(program, 4)
        _LAYOUT_SAVE.append(saved)
    shutil.copytree(_LAYOUT_SAVE[0], d, dirs_exist_ok=True)
    work = d / "sharded"

    def flatten(index, name):  # a parameter's pieces given a 1-D shape of the same size
        p = next(p for u in index["meta"]["units"] for p in u["params"] if p["name"] == name)
        p["shape"] = [int(np.prod(p["shape"]))]

    if how == "no index":
        (work / "index.json").unlink()
    elif how == "consolidated params":
        arrays, meta = mp.files.load_arrays(d / "full")
        mp.files.save_arrays(d / "full", arrays, {**meta, "params": {"wte.weight": [16, 16]}})
        work = d / "full"
    else:
        _edit_json(work / "index.json", {
            "step": lambda i: i["meta"].update(step="0"),
            "mesh": lambda i: i["meta"]["mesh"].update(dp_shard=10 ** 9),
            "pieces": lambda i: flatten(i, "blocks.0.attn.proj.weight")}[how])
    checkpoint.read_full_state(work)


def _cases(table):
    return [pytest.param(fn, exc, words, id=name) for name, fn, exc, words in table]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, words", [pytest.param(a, w, id=" ".join(a)) for a, w in CLI_CASES])
def test_the_cli_refuses(argv, words, capsys):
    from minipar.cli import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fn, exc, words",
                         _cases(RUNTIME_CASES + MODEL_CASES + CHECKPOINT_CASES))
def test_the_library_refuses(fn, exc, words):
    with pytest.raises(exc) as e:
        fn()
    msg = str(getattr(e.value, "original", e.value))
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


# ---- helpers of the runtime cases -------------------------------------------------------
def _on(world_size, program):
    """Launch `program` on `world_size` ranks (a runtime case misuses it inside)."""
    return mp.launch(program, world_size)


def _in_worker(call):
    """Each rank of 2 runs `call` in a thread it starts, and waits for it."""
    def program(ctx):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(call).result()
    return mp.launch(program, 2)


def _group_of_launch(world_size):
    """A group over every rank, made inside a launch of `world_size` ranks."""
    return mp.launch(lambda ctx: mp.new_group(range(world_size), name="tp"), world_size)[0]


def _parallel_groups(rank=None, **sizes):
    return ParallelGroups(ParallelDims(**sizes), rank=rank)


def _pipeline(dims, num_layers=2, tie_embeddings=False, **kw):
    """parallelize a tiny GPT on `dims` with the pipeline arguments `kw`."""
    from minipar.nn import GPTConfig
    from minipar.parallel import parallelize
    cfg = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=num_layers,
                    tie_embeddings=tie_embeddings)
    return parallelize(cfg, dims, lr=1e-2, **kw)


def _runner_of_a_plain_gpt():
    """A runner told to run block 0 of 2 of each micro-batch, over a GPT with dropout that
    would draw masks for its block alone (not the global micro-batch's slice)."""
    from minipar.nn import GPT, GPTConfig
    from minipar.parallel.pp import PipelineRunner, build_stages, placement, schedule
    model = GPT(GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, dropout=0.1))
    acts = schedule("1f1b", 1, 2)
    return PipelineRunner(build_stages(model, placement(acts), 0), acts, batch_shard=(0, 2))


def _save_engine_alone():
    """save_sharded(run.engine) of a pipeline rank: the engine alone has no pp coordinate."""
    import tempfile
    from minipar.parallel import checkpoint
    run = _pipeline(ParallelDims(pp=2), microbatches=2)
    with tempfile.TemporaryDirectory() as d:
        checkpoint.save_sharded(run.engine, d)


def test_the_tables_list_at_least_sixty_distinct_bad_inputs():
    ids = [" ".join(a) for a, _ in CLI_CASES] + [c[0] for c in
                                                 RUNTIME_CASES + MODEL_CASES + CHECKPOINT_CASES]
    assert len(ids) == len(set(ids)), "every case once"
    assert len(ids) >= 60
    assert all(table for table in (CLI_CASES, RUNTIME_CASES, MODEL_CASES, CHECKPOINT_CASES))
