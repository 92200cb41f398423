"""The planner's presets: each model's parameters counted from its published architecture
equal the released checkpoints' counts (Llama 3, Mixtral) or the papers' formulas (GPT:
12·l·h² for the layers); the clusters are the runtime's devices and links, the DGX A100's
at the bandwidths NCCL and a streaming kernel are measured to reach."""

import pytest

from minipar.plan.presets import (CLUSTERS, MODELS, ClusterSpec, achieved, cluster,
                                  model)
from minipar.runtime.device import GB
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


def test_the_a100_preset_runs_at_the_measured_bandwidths():
    """NCCL's bus bandwidth on NVLink 3 (~230 GB/s) and on a DGX A100's HDR NICs (192 GB/s
    over 8, 24 a GPU), a streaming kernel's 1.80 TB/s of HBM: the links keep their names
    and latencies, runtime.topology's presets stay nominal, and memory_bandwidth stays the
    data sheet's (runtime.DeviceSpec's)."""
    a100 = CLUSTERS["a100"]
    assert a100.intra == Link("NVLink3", 230 * GB, Link.nvlink3().latency)
    assert a100.inter == Link("IB-HDR200", 24 * GB, Link.infiniband_hdr().latency)
    assert Link.nvlink3().bandwidth == 300 * GB
    assert Link.infiniband_hdr().bandwidth == 25 * GB
    assert a100.topology(nodes=2).intra == a100.intra
    assert (a100.memory_bandwidth, a100.elementwise_bandwidth) == (2039 * GB, 1800 * GB)
    h100 = CLUSTERS["h100"]  # no measurement used: the data sheet's
    assert h100.elementwise_bandwidth == h100.memory_bandwidth == 3350 * GB
    with pytest.raises(ValueError, match=r"bus bandwidth is in \(0, 3e\+11\]"):
        achieved(Link.nvlink3(), 400 * GB)
    with pytest.raises(ValueError, match="achieved_memory_bandwidth is in"):
        ClusterSpec("x", a100.device, 8, a100.intra, a100.inter, 2039 * GB, 2500 * GB)


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
