"""launch caps BLAS threads at max(1, cores // world_size) while ranks run, then restores."""

import pytest

import minipar as mp
from minipar.runtime.blas import blas_threads, limit_blas_threads, threads_per_rank


def test_threads_per_rank_arithmetic(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert [threads_per_rank(n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]


@pytest.mark.timeout(20)
def test_launch_caps_and_restores_blas_threads():
    before = blas_threads()
    if before is None:
        pytest.skip("NumPy's BLAS thread count cannot be reached on this installation")
    inside = mp.launch(lambda ctx: blas_threads(), 4)
    assert inside == [max(1, min(before, threads_per_rank(4)))] * 4
    assert blas_threads() == before
    with limit_blas_threads(1):
        assert blas_threads() == 1
    assert blas_threads() == before
