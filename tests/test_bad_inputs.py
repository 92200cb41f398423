"""Every bad input minipar is known to meet, and what it must answer: a clear error that names
the fix, never a traceback from deep inside, a hang, or a wrong result.

One table per area. A CLI case is (argv, words the error must contain): the command must exit
with argparse's status 2 (or the documented status) and print no traceback. A library case
is (id, a function that misuses minipar, the exception type, words its message must contain).
Each case failed (crashed, hung or answered wrongly) before the hardening issue.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

import minipar as mp  # noqa: F401  (the cases below use it)
from minipar.parallel.mesh import ParallelDims, ParallelGroups

# ---- the command line --------------------------------------------------------------------
CLI_CASES: list[tuple[list[str], list[str]]] = [
    # (argv after `minipar`, words the message must contain)
]


# ---- the runtime: launch, groups, collectives, sends --------------------------------------
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
]


# ---- the model, the optimizers and `minipar train` -----------------------------------------
MODEL_CASES: list[tuple[str, object, type, list[str]]] = [
]


# ---- checkpoints and files ----------------------------------------------------------------
CHECKPOINT_CASES: list[tuple[str, object, type, list[str]]] = [
]


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
