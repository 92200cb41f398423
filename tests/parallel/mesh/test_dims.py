"""ParallelDims: validated sizes, Megatron's order string and the torch mesh spelling."""

import importlib

import pytest
from hypothesis import given, strategies as st

import minipar as mp
from minipar.parallel.mesh import DEFAULT_ORDER, ParallelDims, ParallelGroups

dims_module = importlib.import_module("minipar.parallel.mesh.dims")


def test_world_size_and_the_two_spellings_of_the_default_order():
    d = ParallelDims(dp_replicate=2, dp_shard=3, tp=4)
    assert d.world_size == 24 and d.dp == 6
    assert d.order == DEFAULT_ORDER == "tp-cp-ep-dp-pp"
    # torch's init_device_mesh spells the same layout slowest first
    assert d.mesh_dim_names == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert d.mesh_shape == (1, 2, 3, 1, 4)


def test_an_order_puts_dp_fastest_and_ep_is_folded():
    d = ParallelDims(dp_replicate=2, tp=4, order="dp-tp")
    assert d.mesh_dim_names == ("pp", "cp", "tp", "dp_replicate", "dp_shard")
    assert ParallelDims(order="pp-ep-dp-cp-tp").mesh_dim_names == (
        "tp", "cp", "dp_replicate", "dp_shard", "pp")


@pytest.mark.parametrize("kw, words", [
    (dict(tp=0), ["tp=0", "positive integer"]),
    (dict(dp_shard=2.0), ["dp_shard=2.0", "positive integer"]),
    (dict(tp=True), ["tp=True"]),
    (dict(dp_shard=4, ep=3), ["ep=3", "must divide dp x cp", "[1, 2, 4]"]),
    (dict(tp=2, order="tp-xx"), ["unknown ['xx']"]),
    (dict(tp=2, order="tp-tp-dp"), ["repeated"]),
    (dict(tp=2, dp_shard=2, order="tp-pp"), ["leaves out ['dp']"]),
])
def test_bad_dims_are_refused_naming_the_fix(kw, words):
    with pytest.raises(ValueError) as e:
        ParallelDims(**kw)
    for w in words:
        assert w in str(e.value)


def test_every_dimension_has_landed_and_a_form_that_has_not_would_be_refused(monkeypatch):
    assert ParallelDims(dp_shard=2, ep=2).world_size == 2  # ep folds into dp: no extra ranks
    assert ParallelDims(pp=2, cp=2, tp=2).world_size == 8
    ParallelDims(pp=2, dp_shard=2, tp=2, cp=2).check_implemented()  # pipelines, cp ...
    ParallelDims(dp_replicate=4, ep=2).check_implemented()  # ... and expert parallelism
    monkeypatch.setattr(dims_module, "IMPLEMENTED", ("dp_replicate", "dp_shard", "tp", "pp",
                                                     "ep"))
    with pytest.raises(ValueError) as e:  # how a form that had not landed was refused
        ParallelDims(cp=2).check_implemented()
    assert "context parallelism" in str(e.value) and "not landed" in str(e.value)
    assert "cp=1 only" in str(e.value)


def test_a_world_the_dims_do_not_cover_is_refused():
    def program(ctx):
        with pytest.raises(ValueError) as e:
            ParallelGroups(ParallelDims(dp_shard=2, tp=2))
        return str(e.value)
    msg = mp.launch(program, 8)[5]
    assert msg.startswith("rank 5: ParallelDims(dp_shard=2, tp=2) covers 4 ranks")
    assert "the world has 8" in msg and "dp_shard=2 x" in msg


@given(dr=st.integers(1, 2), ds=st.integers(1, 3), tp=st.integers(1, 3),
       order=st.permutations(["tp", "cp", "ep", "dp", "pp"]))
def test_the_mesh_spelling_has_every_rank_once(dr, ds, tp, order):
    d = ParallelDims(dp_replicate=dr, dp_shard=ds, tp=tp, order="-".join(order))
    assert sorted(d.mesh_dim_names) == sorted(["pp", "dp_replicate", "dp_shard", "cp", "tp"])
    names = d.mesh_dim_names
    assert names.index("dp_replicate") + 1 == names.index("dp_shard")  # shard inside replicate
    prod = 1
    for s in d.mesh_shape:
        prod *= s
    assert prod == d.world_size == dr * ds * tp
