"""Linear warmup then cosine decay, and the scheduler that sets `opt.lr`."""

import math

import numpy as np
import pytest

import minipar
from minipar.nn.parameter import Parameter
from minipar.optim import SGD, AdamW, LRScheduler, MixedPrecisionOptimizer, WarmupCosine, \
    warmup_cosine

KW = dict(max_lr=1.0, warmup_steps=10, total_steps=110, min_lr=0.1)


def test_warmup_cosine_values():
    assert warmup_cosine(0, **KW) == 0.0                      # warmup starts from zero
    assert warmup_cosine(5, **KW) == pytest.approx(0.5)       # linear: 1.0 * 5 / 10
    assert warmup_cosine(10, **KW) == 1.0                     # end of warmup: the peak
    # midpoint of the decay (step 60 of 10..110): min + ½(max − min)(1 + cos(π/2))
    assert warmup_cosine(60, **KW) == pytest.approx(0.1 + 0.5 * 0.9 * 1.0)   # 0.55
    assert warmup_cosine(35, **KW) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))
    assert warmup_cosine(110, **KW) == pytest.approx(0.1)     # end: min_lr
    assert warmup_cosine(111, **KW) == 0.1                    # after the end: constant
    assert warmup_cosine(10_000, **KW) == 0.1


def test_warmup_cosine_shape():
    lrs = [warmup_cosine(s, **KW) for s in range(130)]
    assert all(x < y for x, y in zip(lrs[:10], lrs[1:11]))            # rising in warmup
    assert all(x >= y for x, y in zip(lrs[10:], lrs[11:]))            # never rising after
    assert min(lrs[10:]) == pytest.approx(0.1) and max(lrs) == 1.0


def test_warmup_cosine_edges_and_errors():
    assert warmup_cosine(0, 2.0, 0, 10) == 2.0                        # no warmup
    assert warmup_cosine(10, 2.0, 10, 10) == 0.0                      # warmup only
    with pytest.raises(ValueError):
        warmup_cosine(0, 1.0, 20, 10)
    with pytest.raises(ValueError):
        warmup_cosine(-1, 1.0, 0, 10)
    with pytest.raises(ValueError):
        warmup_cosine(0, 1.0, 0, 10, min_lr=2.0)


def test_scheduler_sets_the_optimizer_lr():
    with minipar.device():
        opt = SGD([Parameter("w", np.zeros(2))], lr=123.0)
        sched = WarmupCosine(opt, **KW)
        assert opt.lr == 0.0                                          # lr(0) at construction
        seen = [sched.step() for _ in range(120)]
        assert seen[9] == 1.0                                         # after 10 steps
        assert opt.lr == 0.1
        sd = sched.state_dict()
        assert sd == {"last_step": 120}
        other = LRScheduler(opt, lambda s: warmup_cosine(s, **KW))
        other.load_state_dict({"last_step": 60})
        assert opt.lr == pytest.approx(0.55)


def test_scheduler_drives_the_mixed_precision_optimizer():
    with minipar.device():
        p = Parameter("w", np.zeros(2, dtype=np.float16))
        opt = MixedPrecisionOptimizer(AdamW, [p], dtype="float16", lr=5.0)
        sched = WarmupCosine(opt, max_lr=0.2, warmup_steps=2, total_steps=4)
        assert opt.lr == 0.0 and opt.inner.lr == 0.0
        sched.step()
        assert opt.inner.lr == pytest.approx(0.1)
