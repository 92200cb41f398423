"""DDP refuses a backward that left buckets unlaunched (parameters unused in the loss), as
PyTorch's DDP does without find_unused_parameters: the replicas would otherwise step on
their own unreduced gradients and drift apart without an error, or, when only some ranks
skip, the others would wait in the bucket. A backward that uses every parameter is
unchanged."""

import numpy as np
import pytest

import minipar as mp
from minipar.nn import GPT, GPTConfig
from minipar.parallel import DistributedDataParallel

CFG = GPTConfig(vocab_size=16, seq_len=4, hidden=8, num_heads=2, num_layers=3)
IDS = np.random.default_rng(0).integers(0, 16, (4, 4))


def step(skip_on: set, cap_mb: float):
    """One DDP step of 2 ranks whose forward calls block 1 except on the ranks in skip_on."""
    def program(ctx):
        model = GPT(CFG)
        ddp = DistributedDataParallel(model, lr=1e-2, bucket_cap_mb=cap_mb)
        mine = slice(2 * ctx.rank, 2 * ctx.rank + 2)
        blocks = [0, 2] if ctx.rank in skip_on else [0, 1, 2]
        x, s_embed = model.embed_forward(IDS[:, mine], None)
        saved = []
        for i in blocks:
            x, s = model.blocks_forward(x, None, i, i + 1)
            saved.append((i, s))
        loss, s_head = model.head_forward(x, np.roll(IDS, -1, 0)[:, mine])
        dx = model.head_backward(s_head, 1.0)
        for i, s in reversed(saved):
            dx = model.blocks_backward(dx, s, i, i + 1)
        model.embed_backward(dx, s_embed)
        ddp.step()
        return np.concatenate([p.data.ravel() for p in model.parameters()])
    return mp.launch(program, 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cap_mb, first, count", [(25.0, 0, 1), (0.002, 3, 10)])
def test_an_unused_block_on_every_rank_is_refused_naming_its_bucket(cap_mb, first, count):
    with pytest.raises(mp.RankFailedError) as info:
        step({0, 1}, cap_mb)
    # both ranks refuse; whichever the launcher hears from first is reported
    assert info.value.rank in (0, 1) and isinstance(info.value.original, RuntimeError)
    text = str(info.value)
    assert f"DDP's bucket {first} never fired: unit(s) ['blocks.1'] ran no backward" in text
    assert f"{count - first} of the {count} buckets" in text
    assert "find_unused_parameters=True" in text


@pytest.mark.timeout(60)
def test_an_unused_block_on_one_rank_names_that_rank_not_a_deadlock():
    with pytest.raises(mp.RankFailedError) as info:
        step({1}, 25.0)
    assert info.value.rank == 1 and "never fired" in str(info.value)


@pytest.mark.timeout(60)
def test_every_block_used_steps_and_the_replicas_stay_equal():
    for cap_mb in (25.0, 0.002):
        a, b = step(set(), cap_mb)
        assert np.array_equal(a, b)
