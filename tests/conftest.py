"""Shared test set-up: hypothesis profiles (CI is derandomized, with no deadline)."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=25, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.register_profile("thorough", deadline=None, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def by_steps(model, ids, tgt, rng, k):
    """embed -> blocks 0..k -> blocks k..L -> head, then the backwards in reverse: the
    steps a pipeline stage will run, against which `loss_and_grad` is checked."""
    L = len(model.blocks)
    x, s_embed = model.embed_forward(ids, rng)  # x: [s, b, h] ([s/t, b, h] with SP)
    x, s_low = model.blocks_forward(x, rng, 0, k)
    x, s_high = model.blocks_forward(x, rng, k, L)
    loss, s_head = model.head_forward(x, tgt)
    dx = model.head_backward(s_head, 1.0)
    dx = model.blocks_backward(dx, s_high, k, L)
    dx = model.blocks_backward(dx, s_low, 0, k)
    model.embed_backward(dx, s_embed)
    return loss


@pytest.fixture
def gpt_steps():
    """by_steps(model, ids, targets, rng, k): a GPT's forward and backward run step by step."""
    return by_steps
