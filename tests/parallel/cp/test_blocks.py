"""The causal mask, block by block: over a ring's cp steps each rank computes every (query,
key) pair with key position <= query position exactly once and no other, whatever the
layout; the skipped blocks are the fully masked ones; contiguous and zigzag have the
shapes ring-flash-attention gives them; the charge is 1 per full, 1/2 per diagonal pair."""

from fractions import Fraction

import numpy as np
import pytest

from minipar.parallel.cp import (causal_allowed, chunk_size, chunks, pair_kind, plan_block,
                                 positions)
from minipar.parallel.cp.blocks import slot_rows


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("per_chunk", [1, 3])
def test_the_steps_cover_the_causal_mask_exactly_once(layout, cp, per_chunk):
    k = 2 if layout == "zigzag" else 1
    s = k * cp * per_chunk
    c = chunk_size(layout, cp, s)
    seen = np.zeros((s, s), dtype=int)  # seen[query position, key position]
    for me in range(cp):
        q_pos = positions(layout, me, cp, s)
        for src in range(cp):
            blk = plan_block(chunks(layout, me, cp), chunks(layout, src, cp))
            if blk.skipped:  # skipped only when every key lies after every query
                k_pos = positions(layout, src, cp, s)
                assert (k_pos[None, :] > q_pos[:, None]).all()
                continue
            rows, cols = slot_rows(blk.q_slots, c), slot_rows(blk.k_slots, c)
            qp, kp = q_pos[rows], positions(layout, src, cp, s)[cols]
            allowed = causal_allowed(qp, kp)
            assert allowed.any(axis=1).all()  # no query row without a key: no NaN
            seen[np.ix_(qp, kp)] += allowed
    np.testing.assert_array_equal(seen, np.tril(np.ones((s, s), dtype=int)))


def test_contiguous_blocks_are_full_diagonal_or_skipped():
    for me in range(4):
        for src in range(4):
            blk = plan_block(chunks("contiguous", me, 4), chunks("contiguous", src, 4))
            want = "full" if src < me else "diagonal" if src == me else "masked"
            assert blk.kinds == ((want,),)
            assert blk.units == {"full": 1, "diagonal": Fraction(1, 2), "masked": 0}[want]
            assert blk.skipped == (src > me)


def test_zigzag_blocks_are_ring_flash_attentions():
    """Own step: the whole block under a causal mask; an earlier rank's K/V: every query,
    the first key chunk; a later rank's: the second query chunk, every key. Each step is
    charged 2 units (half of the 2x2 chunk rectangle), so every rank does the same work."""
    cp = 4
    for me in range(cp):
        for src in range(cp):
            blk = plan_block(chunks("zigzag", me, cp), chunks("zigzag", src, cp))
            if src == me:
                assert (blk.q_slots, blk.k_slots) == ((0, 1), (0, 1))
                assert blk.kinds == (("diagonal", "masked"), ("full", "diagonal"))
            elif src < me:
                assert (blk.q_slots, blk.k_slots) == ((0, 1), (0,))
            else:
                assert (blk.q_slots, blk.k_slots) == ((1,), (0, 1))
            assert blk.units == 2


def test_pair_kinds():
    assert [pair_kind(2, j) for j in (1, 2, 3)] == ["full", "diagonal", "masked"]
