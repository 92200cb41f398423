"""The SPMD harness: meshes with explicit groups, one rank vocabulary, copied inputs,
recorded collectives, informative shrinking."""

import numpy as np
import pytest
from hypothesis import find

import minipar as mp
from minipar.course.expect import GradeFailure, expect_close
from minipar.course.spmd import (calls, forbid_collectives, mesh_of, on_mesh, rank_words,
                                 world_sizes)
from minipar.runtime.errors import DeadlockError, RankFailedError
from minipar.runtime.mesh import DeviceMesh


def test_rank_words_name_group_rank_global_rank_and_group():
    mesh = DeviceMesh((2, 2), ("dp", "tp"))
    assert rank_words(mesh, "tp", 2) == ("tp rank 0 of 2 = global rank 2 of 4, the second tp "
                                         "group [2, 3]")
    assert rank_words(mesh, "dp", 3) == ("dp rank 1 of 2 = global rank 3 of 4, the second dp "
                                         "group [1, 3]")


@pytest.mark.parametrize("strided", [False, True])
def test_on_mesh_passes_each_rank_its_group(strided):
    shape, names, dim = mesh_of(3, strided=strided)

    def program(ctx, spmd):
        return spmd.group.ranks, spmd.rank, spmd.size, mp.all_reduce(
            np.array([float(ctx.rank)]), group=spmd.group)[0]

    out = on_mesh(program, shape, names, dim)
    mesh = DeviceMesh(shape, names)
    for rank, (ranks, grank, size, total) in enumerate(out):
        g = mesh.get_group(dim, rank)
        assert ranks == g.ranks and grank == g.group_rank(rank) and size == 3
        assert total == sum(g.ranks)


def test_an_answer_that_ignores_the_group_fails_on_the_mesh():
    def wrong_sum(x, group=None):
        return mp.all_reduce(x)  # the world, not the group

    def program(ctx, spmd):
        x = np.array([float(ctx.rank)])
        expect_close(calls(ctx, wrong_sum, x, spmd.group).result,
                     mp.all_reduce(x, group=spmd.group), what="sum(x, group)", rank=spmd.words)

    with pytest.raises(GradeFailure) as e:
        on_mesh(program, (2, 2), ("dp", "tp"), "tp")
    assert str(e.value).startswith("tp rank 0 of 2 = global rank 0 of 4, the first tp group "
                                   "[0, 1]: sum(x, group):")
    assert e.value.__notes__[-1] == ("(raised on tp rank 0 of 2 = global rank 0 of 4, the "
                                     "first tp group [0, 1])")


def test_the_lowest_failing_rank_is_reported_even_when_the_others_deadlock():
    def program(ctx, spmd):
        if ctx.rank in (1, 3):
            raise GradeFailure(f"rank {ctx.rank} is wrong")
        mp.barrier()  # ranks 0 and 2 wait for ranks that left: a deadlock

    with pytest.raises(GradeFailure) as e:
        on_mesh(program, (2, 2), ("dp", "tp"), "tp")
    assert str(e.value) == "rank 1 is wrong"


def test_calls_copies_inputs_and_names_a_mutation():
    def in_place(x, y):
        x *= 2
        return x + y

    def program(ctx):
        x, y = np.arange(4.0), np.ones(4)
        call = calls(ctx, in_place, x, y, names=["flat_grad", "other"])
        return call

    with pytest.raises(RankFailedError) as e:
        mp.launch(program, 1)
    assert isinstance(e.value.original, GradeFailure)
    text = str(e.value.original)
    assert ("rank 0: in_place wrote into its input `flat_grad`: 3 of 4 elements of "
            "`flat_grad` changed (first at index (1,))") in text
    assert "compute into a new array" in text


def test_calls_records_collectives_sends_and_bytes():
    def ring_step(x):
        n, r = mp.get_world_size(), mp.get_rank()
        w = mp.isend(x, (r + 1) % n)
        got = mp.recv((r - 1) % n)
        w.wait()
        return mp.all_reduce(got)

    def program(ctx):
        return calls(ctx, ring_step, np.ones(4))

    for call in mp.launch(program, 2, sends="rendezvous"):
        assert call.collectives == ["all_reduce"] and call.sends == 1
        assert call.bytes_sent == 32 + 32  # one send of 32 bytes, a ring all-reduce of 2·½·32
        with pytest.raises(GradeFailure, match="called the built-in all_reduce: this exercise "
                                               "builds it from point-to-point"):
            forbid_collectives(call, what="ring_step(x)", rank=0)
        forbid_collectives(call, what="ring_step(x)", allowed=["all_reduce"])


def test_world_sizes_shrink_toward_the_informative_size():
    # an answer hard-coded for 2 ranks fails at every other size: the shrunk example is 3
    assert find(world_sizes(1, 5), lambda n: n != 2) == 3
    assert find(world_sizes(1, 5), lambda n: n == 1) == 1  # the edge case is still drawn
    assert find(world_sizes(1, 5), lambda n: True) == 2
    with pytest.raises(ValueError):
        world_sizes(3, 5, first=2)


def test_a_crash_on_one_rank_and_a_failed_check_on_another_report_the_lowest_rank():
    def program(ctx, spmd):
        if ctx.rank == 3:
            raise ZeroDivisionError("rank 3 crashed")
        if ctx.rank == 1:
            raise GradeFailure("rank 1 is wrong")
        mp.barrier()

    for _ in range(5):  # whichever thread fails first, the report is rank 1's
        with pytest.raises(GradeFailure, match="rank 1 is wrong"):
            on_mesh(program, (2, 2), ("dp", "tp"), "dp")

    def crash_only(ctx, spmd):
        if ctx.rank == 2:
            raise ZeroDivisionError("rank 2 crashed")
        mp.barrier()

    with pytest.raises(ZeroDivisionError) as e:
        on_mesh(crash_only, (2, 2), ("dp", "tp"), "dp")
    assert e.value.__notes__[-1] == ("(raised on dp rank 1 of 2 = global rank 2 of 4, the "
                                     "first dp group [0, 2])")


def test_a_real_deadlock_is_reported_as_the_deadlock():
    def ring_of_sends(ctx, spmd):
        n, r = spmd.size, spmd.rank
        mp.send(np.ones(1), spmd.group.ranks[(r + 1) % n])
        mp.recv(spmd.group.ranks[(r - 1) % n])

    with pytest.raises(DeadlockError, match="alternate by parity"):
        on_mesh(ring_of_sends, (1, 3), ("dp", "tp"), "tp")


def test_calls_names_a_rank_in_words():
    def in_place(x):
        x[0] = 9.0
        return x

    def program(ctx, spmd):
        calls(ctx, in_place, np.zeros(2), names=["x"], rank=spmd.words)

    with pytest.raises(GradeFailure, match=r"^tp rank 0 of 2 = global rank 0 of 4, the first "
                                           r"tp group \[0, 1\]: in_place wrote into its input"):
        on_mesh(program, (2, 2), ("dp", "tp"), "tp")
