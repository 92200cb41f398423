"""dp x pp x tp = 2 x 2 x 2 training runs for the MPI backend, each built by `parallelize`.

    mpiexec -n 8 python tests/mpi/pp_program.py mpi OUT_DIR    # one process per rank
    python tests/mpi/pp_program.py sim OUT_DIR                 # eight simulated devices

Every case (CASES) trains the same tiny GPT (tied embeddings, dropout on) for STEPS AdamW
steps with the gradient norm clipped, tensor parallelism with sequence parallelism on
tp = 2, a pipeline on pp = 2 (4 micro-batches a step) and data parallelism on dp = 2: the
1F1B and ZB-H1 schedules, each under DDP and under ZeRO-1. Each rank writes
OUT_DIR/<case>/rank<r>.npz (allow_pickle=False): its losses, its parameters after the
steps, the gradient norm of the last step, its simulated clock and its trace (every
event's stream, name, label, start and end).
"""

from __future__ import annotations

import os
import sys

import numpy as np

import minipar as mp
from minipar.nn import GPTConfig
from minipar.parallel import ParallelDims, parallelize

CFG = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, num_layers=4, dropout=0.1,
                tie_embeddings=True, seed=7)
OPT = dict(lr=1e-2, weight_decay=0.1)
MAX_NORM = 0.05
STEPS, MICRO, DP = 3, 4, 2
WORLD = 8
CASES = {  # name -> (dims, zero, schedule)
    "1f1b_zero1": (ParallelDims(dp_shard=DP, pp=2, tp=2), 1, "1f1b"),
    "1f1b_ddp": (ParallelDims(dp_replicate=DP, pp=2, tp=2), 0, "1f1b"),
    "zb_h1_zero1": (ParallelDims(dp_shard=DP, pp=2, tp=2), 1, "zb_h1"),
    "zb_h1_ddp": (ParallelDims(dp_replicate=DP, pp=2, tp=2), 0, "zb_h1"),
}


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    """STEPS global batches, ids and targets: int [s, MICRO * DP]."""
    rng = np.random.default_rng(13)
    shape = (CFG.seq_len, MICRO * DP)
    return [(rng.integers(0, CFG.vocab_size, shape), rng.integers(0, CFG.vocab_size, shape))
            for _ in range(STEPS)]


def program(ctx, case: str) -> dict[str, np.ndarray]:
    dims, zero, name = CASES[case]
    run = parallelize(CFG, dims, zero=zero, sequence_parallel=True, max_grad_norm=MAX_NORM,
                      schedule=name, microbatches=MICRO, placement="any", **OPT)
    losses = [run.train_step(ids, tgt) for ids, tgt in batches()]
    out = {f"param/{p.name}": p.data for p in run.runner.parameters()}
    assert len(out) == len(run.runner.parameters()), "two parameters share a name"
    out["losses"] = np.array(losses)
    out["grad_norm"] = np.array(run.engine.last_grad_norm)
    c = ctx.clock
    out["clock"] = np.array([c.compute, c.comm, c.p2p, c.elapsed()])
    events = ctx.trace.events
    out["trace_names"] = np.array([f"{e.stream}:{e.name}:{e.label}" for e in events])
    out["trace_times"] = np.array([[e.start, e.end] for e in events]).reshape(-1, 2)
    return out


def run(backend: str, case: str) -> dict[int, dict[str, np.ndarray]]:
    res = mp.launch(lambda ctx: program(ctx, case), WORLD,
                    topology=mp.Topology.nodes(2, gpus_per_node=4), backend=backend)
    return {ctx.rank: out for out, ctx in zip(res, res.contexts)}


def main(argv: list[str]) -> None:
    if len(argv) != 3 or argv[1] not in ("sim", "mpi"):
        sys.exit(f"usage: {argv[0]} sim|mpi OUT_DIR")
    for case in CASES:
        os.makedirs(os.path.join(argv[2], case), exist_ok=True)
        for rank, arrays in run(argv[1], case).items():
            np.savez(os.path.join(argv[2], case, f"rank{rank}.npz"), **arrays)


if __name__ == "__main__":
    main(sys.argv)
