"""ParallelGroups: every rank's groups agree with the mesh, with Megatron's rank order, and
with each other (a rank is in exactly one group of each kind)."""

from hypothesis import given, settings, strategies as st

import minipar as mp
from minipar.parallel.mesh import ParallelDims, ParallelGroups


def groups_of(dims):
    return mp.launch(lambda ctx: ParallelGroups(dims), dims.world_size)


def test_tp_fastest_on_two_nodes_of_four():
    gs = groups_of(ParallelDims(dp_shard=2, tp=4))
    assert gs[0].tp.ranks == (0, 1, 2, 3) and gs[5].tp.ranks == (4, 5, 6, 7)
    assert gs[1].dp.ranks == (1, 5) and gs[1].dp_shard.ranks == (1, 5)
    assert gs[1].dp_replicate.ranks == (1,)
    assert gs[6].coordinate == {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "cp": 0, "tp": 2}
    assert [g.batch_shard for g in gs] == [(0, 2)] * 4 + [(1, 2)] * 4


def test_dp_fastest_puts_tp_across_nodes():
    gs = groups_of(ParallelDims(dp_replicate=2, tp=4, order="dp-tp"))
    assert gs[0].tp.ranks == (0, 2, 4, 6) and gs[0].dp.ranks == (0, 1)
    assert gs[3].batch_shard == (1, 2)


def test_hybrid_split_of_dp_and_the_flattened_groups():
    # 2 replicas x 2 shards x tp 2 = 8 ranks, default order
    gs = groups_of(ParallelDims(dp_replicate=2, dp_shard=2, tp=2))
    g = gs[3]  # replicate 0, shard 1, tp 1
    assert g.coordinate["dp_replicate"] == 0 and g.coordinate["dp_shard"] == 1
    assert g.dp_shard.ranks == (1, 3) and g.dp_replicate.ranks == (3, 7)
    assert g.dp.ranks == (1, 3, 5, 7) == g.dp_cp.ranks
    assert g.dp_rank == 1 and gs[5].dp_rank == 2  # replicate-major: 2 * 1 + 0
    assert g.rank_of(dp_replicate=1) == 7 and g.rank_of(tp=0, dp_shard=0) == 0


def test_expert_groups_are_consecutive_members_of_dp_cp():
    gs = groups_of(ParallelDims(dp_shard=4, tp=2, ep=2))
    assert gs[0].ep.ranks == (0, 2) and gs[4].ep.ranks == (4, 6) and gs[7].ep.ranks == (5, 7)
    # edp: the same place in each ep group, the ranks that hold the same experts
    assert gs[0].edp.ranks == (0, 4) and gs[2].edp.ranks == (2, 6) and gs[7].edp.ranks == (3, 7)
    for g in gs:
        assert set(g.ep.ranks) & set(g.edp.ranks) == {g.rank}
        assert len(g.ep.ranks) * len(g.edp.ranks) == len(g.dp_cp.ranks)


def test_group_names_are_the_dimensions():
    g = groups_of(ParallelDims(dp_shard=2, tp=2))[0]
    assert [x.name for x in (g.tp, g.pp, g.cp, g.dp, g.dp_shard, g.dp_replicate, g.dp_cp, g.ep)
            ] == ["tp", "pp", "cp", "dp", "dp_shard", "dp_replicate", "dp_cp", "ep"]


@settings(max_examples=20)
@given(dr=st.integers(1, 2), ds=st.integers(1, 2), tp=st.integers(1, 3),
       order=st.permutations(["tp", "cp", "ep", "dp", "pp"]))
def test_every_kind_of_group_partitions_the_world(dr, ds, tp, order):
    """Each rank is in exactly one group of each kind; the groups of a kind partition the
    world; a tp group and a dp group meet in exactly one rank; the coordinates are the
    torch mesh's (init_device_mesh with the dims' torch spelling)."""
    dims = ParallelDims(dp_replicate=dr, dp_shard=ds, tp=tp, order="-".join(order))
    gs = groups_of(dims)
    mesh = mp.DeviceMesh(dims.mesh_shape, dims.mesh_dim_names)
    for kind in ("tp", "dp", "dp_shard", "dp_replicate", "pp", "cp", "dp_cp"):
        seen = {getattr(g, kind).ranks for g in gs}
        assert sorted(r for ranks in seen for r in ranks) == list(range(dims.world_size))
    for r, g in enumerate(gs):
        assert g.rank == r and g.coordinate == mesh.coordinate(r)
        assert set(g.tp.ranks) & set(g.dp.ranks) == {r}
        assert g.tp.size == tp and g.dp.size == dr * ds
        assert g.tp.ranks == mesh.get_group("tp", r).ranks
