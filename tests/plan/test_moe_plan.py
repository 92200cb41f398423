"""plan/moe.py: total and active parameters of a mixture-of-experts transformer, from its
architecture. DeepSeek-V3's report (DeepSeek-AI 2024, abstract and section 2) gives 671B
parameters in total, 37B activated per token; the counts computed from its published
configuration must land on them."""

import pytest

from minipar.nn import GPTConfig
from minipar.nn.moe import MoEConfig
from minipar.plan.moe import DEEPSEEK_V3, MLAConfig, MoETransformer


def test_deepseek_v3_has_671b_parameters_and_37b_active():
    total, active = DEEPSEEK_V3.total_parameters(), DEEPSEEK_V3.active_parameters()
    assert total == 671_026_404_352  # the report: 671B
    assert round(total / 1e9) == 671
    assert active == 37_552_282_624  # the report: 37B activated for each token
    assert int(active / 1e9) == 37
    assert DEEPSEEK_V3.flops_per_token() == 6 * active


def test_only_the_routed_experts_make_the_difference():
    m = DEEPSEEK_V3
    per_expert = 3 * m.hidden * m.expert_ffn  # a SwiGLU expert: gate, up, down
    moe_layers = m.layers - m.dense_layers
    assert m.total_parameters() - m.active_parameters() == \
        moe_layers * (m.experts - m.top_k) * per_expert


def test_a_dense_model_is_all_active():
    m = MoETransformer(vocab_size=100, hidden=16, layers=4, dense_layers=4, dense_ffn=64,
                       experts=8, top_k=2, expert_ffn=32, shared_experts=1,
                       attention=MLAConfig(2, 0, 8, 4, 4, 8))
    assert m.total_parameters() == m.active_parameters()


@pytest.mark.parametrize("E, k", [(4, 1), (8, 2), (16, 4)])
def test_more_experts_add_total_not_active_parameters_in_the_gpt_too(E, k):
    """The same rule on the GPT the library trains (GeLU experts with biases)."""
    small = GPTConfig(hidden=16, num_heads=2, moe=MoEConfig(num_experts=E, top_k=k))
    big = GPTConfig(hidden=16, num_heads=2, moe=MoEConfig(num_experts=2 * E, top_k=k))
    router = E * 16  # the router of E more experts, in each of the 2 layers
    assert big.num_active_parameters() - small.num_active_parameters() == 2 * router
    expert = 2 * 16 * 64 + 64 + 16
    assert big.num_parameters() - small.num_parameters() == 2 * (router + E * expert)
