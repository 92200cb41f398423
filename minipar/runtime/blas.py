"""Share the machine's cores between simulated devices: cap BLAS threads during a launch.

Every simulated rank is a thread, and every rank's matmul would otherwise start a
multi-threaded BLAS call of its own: 8 ranks x 2 BLAS threads on 2 cores spend their time
switching rather than computing. While a multi-rank launch runs, `launch` caps the BLAS
thread count at max(1, cores // world_size) and restores it afterwards. This reaches
NumPy's bundled OpenBLAS through ctypes (the library NumPy's wheels ship); where it cannot
be found, nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
from typing import Callable, Iterator, Optional

import numpy

_api: Optional[tuple[Callable[[], int], Callable[[int], None]]] = None
_searched = False


def _find() -> Optional[tuple[Callable[[], int], Callable[[int], None]]]:
    """(get, set) of NumPy's bundled OpenBLAS thread count, or None."""
    global _api, _searched
    if _searched:
        return _api
    _searched = True
    base = os.path.dirname(os.path.dirname(numpy.__file__))
    paths = glob.glob(os.path.join(base, "numpy.libs", "*openblas*")) + \
        glob.glob(os.path.join(os.path.dirname(numpy.__file__), ".dylibs", "*openblas*"))
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas_", "openblas_"):
            for suffix in ("64_", ""):
                get = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    get.restype = ctypes.c_int
                    put.argtypes = [ctypes.c_int]
                    _api = (get, put)
                    return _api
    return None


def blas_threads() -> Optional[int]:
    """NumPy's BLAS thread count, or None when it cannot be read."""
    api = _find()
    return None if api is None else int(api[0]())


@contextlib.contextmanager
def limit_blas_threads(n: int) -> Iterator[None]:
    """Run a block with at most n BLAS threads (no-op if BLAS cannot be reached)."""
    api = _find()
    if api is None:
        yield
        return
    before = int(api[0]())
    api[1](max(1, min(n, before)))
    try:
        yield
    finally:
        api[1](before)


def threads_per_rank(world_size: int) -> int:
    """max(1, cores // world_size): the BLAS threads each simulated rank may use."""
    return max(1, (os.cpu_count() or 1) // max(1, world_size))
