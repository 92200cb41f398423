"""Checkpoint files that never run code: NumPy arrays in .npz, metadata in JSON.

The rule: a checkpoint is read with allow_pickle=False, and a file that would need a
pickle (an object array, a pickle renamed .npz) is refused before any array is loaded.
Loading a checkpoint never runs code.

    arrays.py   one checkpoint: save_arrays(path, arrays, meta) -> path.npz + path.json;
                load_arrays(path) -> (arrays, meta); ml_dtypes stored as their bits
    npz.py      an .npz opened without trusting it: every declared size checked against
                the file's bytes before anything is allocated; damage named by member
    sharded.py  a sharded checkpoint: one file pair per rank and an index.json;
                save_sharded, load_sharded, consolidate
    atomic.py   paths, atomic writes (temporary file + os.replace), the JSON documents
    errors.py   CheckpointError, PickledCheckpointError

These are files only; what a parallel run writes into them (which rank holds which shard
of which parameter) is parallel/checkpoint's business.
"""

from .arrays import FORMAT, load_arrays, save_arrays
from .atomic import VERSION, check_writable, check_writable_dir, checkpoint_paths, write_json
from .errors import CheckpointError, PickledCheckpointError
from .sharded import (INDEX_NAME, SHARDED_FORMAT, consolidate, load_sharded,
                      save_consolidated, save_sharded, shard_file_stem)

__all__ = ["FORMAT", "SHARDED_FORMAT", "VERSION", "INDEX_NAME", "CheckpointError",
           "PickledCheckpointError", "checkpoint_paths", "check_writable", "check_writable_dir",
           "save_arrays", "load_arrays", "shard_file_stem", "save_sharded", "load_sharded",
           "consolidate", "save_consolidated", "write_json"]
