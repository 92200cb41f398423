"""A dp x tp training run for the MPI backend, built by `parallelize`: TensorParallelGPT with
sequence parallelism and dropout, 2 x 2 mesh, ZeRO-1 over dp, 2 AdamW steps with clipping.

    mpiexec -n 4 python tests/mpi/tp_program.py mpi OUT_DIR    # one process per rank
    python tests/mpi/tp_program.py sim OUT_DIR                 # four simulated devices

Each rank writes OUT_DIR/rank<r>.npz: its losses, its parameter shards after the steps,
the gradient norm, and its simulated clock.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import minipar as mp
from minipar.nn import GPTConfig
from minipar.parallel import ParallelDims, parallelize

DIMS = ParallelDims(dp_shard=2, tp=2)
WORLD = DIMS.world_size
CFG = GPTConfig(vocab_size=16, seq_len=8, hidden=16, num_heads=4, num_layers=2, dropout=0.1,
                seed=5)
OPT = dict(lr=1e-2, weight_decay=0.1)
MAX_NORM = 0.05


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    return [(rng.integers(0, CFG.vocab_size, (CFG.seq_len, 4)),
             rng.integers(0, CFG.vocab_size, (CFG.seq_len, 4))) for _ in range(2)]


def program(ctx) -> dict[str, np.ndarray]:
    run = parallelize(CFG, DIMS, zero=1, sequence_parallel=True, max_grad_norm=MAX_NORM, **OPT)
    losses = [run.train_step(ids, tgt) for ids, tgt in batches()]
    model, engine = run.model, run.engine
    out = {f"param/{p.name}": p.data for p in model.parameters()}
    out["losses"] = np.array(losses)
    out["grad_norm"] = np.array(engine.last_grad_norm)
    c = ctx.clock
    out["clock"] = np.array([c.compute, c.comm, c.p2p, c.elapsed()])
    return out


def run(backend: str) -> dict[int, dict[str, np.ndarray]]:
    res = mp.launch(program, WORLD, backend=backend)
    return {ctx.rank: out for out, ctx in zip(res, res.contexts)}


def main(argv: list[str]) -> None:
    if len(argv) != 3 or argv[1] not in ("sim", "mpi"):
        sys.exit(f"usage: {argv[0]} sim|mpi OUT_DIR")
    os.makedirs(argv[2], exist_ok=True)
    for rank, arrays in run(argv[1]).items():
        np.savez(os.path.join(argv[2], f"rank{rank}.npz"), **arrays)


if __name__ == "__main__":
    main(sys.argv)
