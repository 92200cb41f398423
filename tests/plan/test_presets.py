"""The planner's presets: each model's parameters counted from its published architecture
equal the released checkpoints' counts (Llama 3, Mixtral) or the papers' formulas (GPT:
12·l·h² for the layers); the clusters are the runtime's devices and links."""

import pytest

from minipar.plan.presets import CLUSTERS, MODELS, cluster, model
from minipar.runtime.topology import Link


@pytest.mark.parametrize("name, total, active", [
    ("llama2-7b", 6_738_415_616, 6_738_415_616),  # the released checkpoints' counts
    ("llama3-8b", 8_030_261_248, 8_030_261_248),
    ("llama3-70b", 70_553_706_496, 70_553_706_496),
    ("llama3-405b", 405_853_388_800, 405_853_388_800),
    ("mixtral-8x7b", 46_702_792_704, 12_879_925_248),  # "47B total, 13B active"
])
def test_counted_parameters_equal_the_published_ones(name, total, active):
    m = model(name)
    assert (m.parameters(), m.parameters(active=True)) == (total, active)


@pytest.mark.parametrize("name", ["22b", "175b", "530b", "1t", "sc21-1.7b", "sc21-145.6b"])
def test_a_megatron_gpt_is_12lh2_plus_its_biases_norms_and_ends(name):
    m = model(name)
    l, h, V, s = m.layers, m.hidden, m.vocab, m.seq_len
    assert m.transformer_parameters() == 12 * l * h * h + 13 * l * h
    assert m.parameters() == 12 * l * h * h + 13 * l * h + 2 * V * h + s * h + 2 * h


def test_the_gpt3_row_is_the_175b_of_its_paper_and_deepseek_is_counted_in_plan_moe():
    assert round(model("gpt3-175b").parameters() / 1e9) == 175
    assert model("deepseek-v3").total_parameters() == 671_026_404_352


def test_clusters_and_names():
    h100 = cluster("H100")
    assert h100.intra == Link.nvlink4() and h100.inter == Link.infiniband_ndr()
    topo = h100.topology(nodes=4)
    assert topo.world_size == 32 and topo.device.peak("bfloat16") == 989e12
    assert CLUSTERS["h800"].intra.bandwidth == CLUSTERS["h100"].intra.bandwidth * 4 / 9
    assert model("Llama3_70B") is MODELS["llama3-70b"]
    with pytest.raises(ValueError, match="unknown model 'llama4'.*expected one of"):
        model("llama4")
    with pytest.raises(ValueError, match="unknown cluster 'tpu'"):
        cluster("tpu")


def test_a_layout_checks_itself_and_counts_its_gpus_and_microbatches():
    from minipar.plan.layout import Layout
    lay = Layout(tp=8, pp=8, dp=8, schedule="interleaved_1f1b", chunks=3, global_batch=64,
                 sequence_parallel=True, recompute="selective")
    assert (lay.gpus, lay.microbatches) == (512, 8)
    assert str(lay).startswith("tp 8, pp 8, dp 8, interleaved_1f1b x3, SP")
    for kw, match in ((dict(tp=0), "tp must be a positive int"),
                      (dict(recompute="some"), "recompute must be one of"),
                      (dict(dp=2, ep=4, global_batch=2), "ep = 4 must divide dp x cp = 2"),
                      (dict(sequence_parallel=True), "give tp > 1"),
                      (dict(dp=4, global_batch=6), "not a multiple of micro_batch x dp = 4"),
                      (dict(zero=4), "ZeRO stage 0..3"), (dict(precision="fp8"), "one of")):
        with pytest.raises(ValueError, match=match):
            Layout(**kw)
