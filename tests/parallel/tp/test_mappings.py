"""Megatron's conjugate mappings: each forward matches its definition over the per-rank
blocks, and each backward is the forward's adjoint in the region's own inner product.

A region holds its value either *replicated* (one value, the same on every rank: counted
once) or *per rank* (a block on each rank — a shard, a partial sum, or a rank's own use:
summed over ranks). For a mapping F with backward B,

    <F(x), y>_out == <x, B(y)>_in        for every x, y of the right kinds,

which is exactly what makes B the gradient of F (the chain rule through F).
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.parallel.tp import mappings as M

# mapping -> (input kind, output kind, axis it splits or gathers, or None)
KINDS = {
    M.copy_to_tensor_model_parallel_region: ("replicated", "per_rank", None),
    M.reduce_from_tensor_model_parallel_region: ("per_rank", "replicated", None),
    M.scatter_to_tensor_model_parallel_region: ("replicated", "per_rank", -1),
    M.gather_from_tensor_model_parallel_region: ("per_rank", "replicated", -1),
    M.scatter_to_sequence_parallel_region: ("replicated", "per_rank", 0),
    M.gather_from_sequence_parallel_region: ("per_rank", "per_rank", 0),
    M.reduce_scatter_to_sequence_parallel_region: ("per_rank", "per_rank", 0),
}


def expected_forward(mapping, xs, r, t):
    """The forward's definition on rank r over the list of per-rank inputs xs."""
    x = xs[r]
    name = mapping.name.split(" ")[0]
    if name == "copy_to_tensor_model_parallel_region":
        return x
    if name == "reduce_from_tensor_model_parallel_region":
        return sum(xs)
    if name == "scatter_to_tensor_model_parallel_region":
        return np.split(x, t, axis=-1)[r]
    if name == "gather_from_tensor_model_parallel_region":
        return np.concatenate(xs, axis=-1)
    if name == "scatter_to_sequence_parallel_region":
        return np.split(x, t, axis=0)[r]
    if name == "gather_from_sequence_parallel_region":
        return np.concatenate(xs, axis=0)
    if name == "reduce_scatter_to_sequence_parallel_region":
        return np.split(sum(xs), t, axis=0)[r]
    raise AssertionError(name)


def block(kind, shape, rng, t):
    same = rng.standard_normal(shape)
    return [same if kind == "replicated" else rng.standard_normal(shape) for _ in range(t)]


def inner(kind, a, b):
    if kind == "replicated":
        return float(np.sum(a[0] * b[0]))
    return float(sum(np.sum(x * y) for x, y in zip(a, b)))


def shapes(mapping, t, s, h):
    """(input shape, output shape) per rank for a tensor [s, 2, h] split t ways."""
    whole, by_seq, by_last = (s, 2, h), (s // t, 2, h), (s, 2, h // t)
    name = mapping.name.split(" ")[0]
    return {
        "scatter_to_tensor_model_parallel_region": (whole, by_last),
        "gather_from_tensor_model_parallel_region": (by_last, whole),
        "scatter_to_sequence_parallel_region": (whole, by_seq),
        "gather_from_sequence_parallel_region": (by_seq, whole),
        "reduce_scatter_to_sequence_parallel_region": (whole, by_seq),
    }.get(name, (whole, whole))


@settings(max_examples=30)
@given(t=st.sampled_from([1, 2, 3, 4]), k=st.integers(1, 2), seed=st.integers(0, 999),
       which=st.sampled_from(range(len(M.MAPPINGS))))
def test_forward_matches_definition_and_backward_is_its_adjoint(t, k, seed, which):
    mapping = M.MAPPINGS[which]
    kin, kout, _ = KINDS[mapping]
    s, h = t * k, t * (k + 1)
    in_shape, out_shape = shapes(mapping, t, s, h)
    rng = np.random.default_rng(seed)
    xs, ys = block(kin, in_shape, rng, t), block(kout, out_shape, rng, t)

    def program(ctx):
        g = mp.new_group(range(t), "tp")
        return mapping.forward(xs[ctx.rank], g), mapping.backward(ys[ctx.rank], g)

    res = mp.launch(program, t)
    fx, by = [r[0] for r in res], [r[1] for r in res]
    for r in range(t):
        np.testing.assert_allclose(fx[r], expected_forward(mapping, xs, r, t), rtol=1e-14,
                                   err_msg=f"{mapping.name} forward on rank {r}")
        assert by[r].shape == xs[r].shape
    if kin == "replicated":  # the gradient of a replicated value is replicated too
        for r in range(1, t):
            np.testing.assert_array_equal(by[r], by[0])
    np.testing.assert_allclose(inner(kout, fx, ys), inner(kin, xs, by), rtol=1e-12,
                               err_msg=f"{mapping.name}: backward is not the adjoint")


def test_on_one_rank_every_mapping_is_the_identity_and_communicates_nothing():
    def program(ctx):
        g = mp.new_group([0], "tp")
        x = np.arange(6.0).reshape(2, 1, 3)
        outs = [(m.forward(x, g) is x, m.backward(x, g) is x) for m in M.MAPPINGS]
        return outs, len(ctx.trace.of(stream="comm"))

    outs, comms = mp.launch(program, 1)[0]
    assert all(a and b for a, b in outs) and comms == 0


def test_each_docstring_names_both_halves():
    """Megatron's f and g, as the course writes them."""
    assert repr(M.copy_to_tensor_model_parallel_region).endswith(
        "identity in forward, all-reduce in backward")
    assert repr(M.reduce_from_tensor_model_parallel_region).endswith(
        "all-reduce in forward, identity in backward")
    for m in M.MAPPINGS:
        assert " in forward, " in m.doc and m.doc.endswith(" in backward")


def test_a_split_that_does_not_divide_says_so():
    def program(ctx):
        M.scatter_to_sequence_parallel_region.forward(np.zeros((5, 1, 2)),
                                                      mp.new_group(range(2), "tp"))

    with pytest.raises(mp.RankFailedError, match=r"cannot split axis 0 of shape \(5, 1, 2\)"):
        mp.launch(program, 2)
