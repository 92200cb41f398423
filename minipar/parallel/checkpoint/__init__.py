"""Checkpoints that know their layout: each rank writes what it holds; any layout loads it.

    save_sharded(engine, dir)       every rank holding unique state writes it, nothing is
                                    gathered; files keyed by (pp, tp, dp_shard)  (sharded.py)
    save_consolidated(engine, path) the single-device tensors in one file, by rank 0
                                    (consolidated.py)
    read_full_state(dir_or_path)    either form -> the single-device model's full named
                                    tensors, without an engine                    (full_state.py)
    load(engine, dir_or_path)       either form, into any dp size, ZeRO stage or FSDP
                                    strategy, tp size (+- sequence parallelism), pipeline
                                    or one device; load_state(engine, full_state): the same
                                    from memory
    save_step(run, root)            a run's saves, one root/step-NNNNNNNN each; latest(root)
    resume(run, root)               the newest complete one (an interrupted save skipped,
                                    saying why), loaded                           (steps.py)

`engine` is a data-parallel engine, a FullyShardedDataParallel or parallelize's run. What a
rank holds comes from the engine's `local_state()`, where it sits in the full tensors from
the parameters' tensor-parallel tags (layout.py). NumPy arrays and JSON only, never a
pickle (minipar.files). docs/checkpoints.md walks through a save and its files.
"""

from .consolidated import save_consolidated
from .full_state import load, load_state, read_full_state
from .sharded import save_sharded
from .steps import Latest, latest, resume, save_step, step_dir, why_incomplete

__all__ = ["Latest", "latest", "load", "load_state", "read_full_state", "resume",
           "save_consolidated", "save_sharded", "save_step", "step_dir", "why_incomplete"]
