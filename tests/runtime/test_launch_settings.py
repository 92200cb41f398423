"""What launch changes in the process while ranks run, and restores after: the cyclic
collector's full-collection threshold and the switch interval (runtime/heap.py), and on
Linux 6.16+ the size of the kernel's futex hash (runtime/futex_hash.py)."""

import gc
import sys

import pytest

import minipar as mp
from minipar.runtime import futex_hash
from minipar.runtime.futex_hash import enough_futex_slots, get_slots, slots_for
from minipar.runtime.heap import SWITCH_INTERVAL, factor


def test_slots_are_the_power_of_two_at_or_above_four_per_rank():
    assert [slots_for(n) for n in (1, 2, 4, 5, 1000, 1024, 1025, 4096)] == \
        [16, 16, 16, 32, 4096, 4096, 8192, 16384]


def test_full_collections_are_rarer_in_proportion_to_the_world():
    assert [factor(n) for n in (1, 8, 160, 1024, 4096)] == [10, 10, 10, 64, 256]


@pytest.mark.timeout(30)
def test_launch_sets_and_restores_the_collector_and_the_switch_interval():
    gc_before, interval_before = gc.get_threshold(), sys.getswitchinterval()
    if gc_before[0] == 0:
        pytest.skip("automatic garbage collection is off in this interpreter")
    inside = mp.launch(lambda ctx: (gc.get_threshold(), sys.getswitchinterval()), 32)
    want_gc = (gc_before[0], gc_before[1], gc_before[2] * factor(32))
    want_interval = max(interval_before, SWITCH_INTERVAL)  # CPython keeps microseconds
    assert [gc_ for gc_, _ in inside] == [want_gc] * 32
    assert [i for _, i in inside] == pytest.approx([want_interval] * 32, abs=1e-6)
    assert (gc.get_threshold(), sys.getswitchinterval()) == (gc_before, interval_before)


@pytest.mark.timeout(30)
def test_launch_gives_the_futex_hash_four_buckets_a_rank_and_restores_it():
    before = get_slots()
    if before is None:
        pytest.skip("this kernel has no private futex hash (Linux < 6.16, or not Linux)")
    n = 1100  # above the 4,096 slots any smaller launch asks for: a real change
    inside = mp.launch(lambda ctx: get_slots() if ctx.rank == 0 else None, n)[0]
    assert inside >= slots_for(n) == 8192
    assert get_slots() == before


def test_a_launch_of_fewer_than_1024_ranks_leaves_the_futex_hash_alone(monkeypatch):
    """A resize and its restore cost about 75 ms, more than a small launch takes."""
    calls = []
    def prctl(option, sub, n, *_):
        calls.append((option, sub, n))
        return 16 if sub == futex_hash.PR_FUTEX_HASH_GET_SLOTS else 0

    monkeypatch.setattr(futex_hash, "_prctl", lambda: prctl)
    assert mp.launch(lambda ctx: ctx.rank, futex_hash.RESIZE_FROM - 1)[-1] == 1022
    assert calls == []
    with enough_futex_slots(futex_hash.RESIZE_FROM):
        pass
    assert [c[1] for c in calls] == [futex_hash.PR_FUTEX_HASH_GET_SLOTS,
                                     futex_hash.PR_FUTEX_HASH_SET_SLOTS,
                                     futex_hash.PR_FUTEX_HASH_SET_SLOTS]


def test_without_a_private_futex_hash_nothing_is_touched(monkeypatch):
    monkeypatch.setattr(futex_hash, "_prctl", lambda: None)
    assert get_slots() is None
    with enough_futex_slots(4096):
        assert get_slots() is None


def test_a_refused_resize_is_ignored(monkeypatch):
    calls = []

    def prctl(option, sub, n, *_):
        calls.append((sub, n))
        return 16 if sub == futex_hash.PR_FUTEX_HASH_GET_SLOTS else -1  # EINVAL, say

    monkeypatch.setattr(futex_hash, "_prctl", lambda: prctl)
    with enough_futex_slots(4096):
        pass
    assert calls == [(futex_hash.PR_FUTEX_HASH_GET_SLOTS, 0),
                     (futex_hash.PR_FUTEX_HASH_SET_SLOTS, 16384)]  # no restore of a no-op
