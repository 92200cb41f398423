"""Every bad input minipar is known to meet, and what it must answer: a clear error that names
the fix, never a traceback from deep inside, a hang, or a wrong result.

One table per area. A CLI case is (argv, words the error must contain): the command must exit
with argparse's status 2 (or the documented status) and print no traceback. A library case
is (id, a function that misuses minipar, the exception type, words its message must contain).
Each case failed (crashed, hung or answered wrongly) before the hardening issue.
"""

from __future__ import annotations

import pytest

import minipar as mp  # noqa: F401  (the cases below use it)

# ---- the command line --------------------------------------------------------------------
CLI_CASES: list[tuple[list[str], list[str]]] = [
    # (argv after `minipar`, words the message must contain)
]


# ---- the runtime: launch, groups, collectives, sends --------------------------------------
RUNTIME_CASES: list[tuple[str, object, type, list[str]]] = [
    # (id, fn() that misuses the runtime, exception type, words in its message)
]


# ---- the model, the optimizers and `minipar train` -----------------------------------------
def _train(**kw):
    from minipar.programs.train import TrainConfig, train
    return train(TrainConfig(**kw))


def _gpt(**kw):
    from minipar.nn import GPTConfig
    return GPTConfig(**kw)


def _clip_coef(total, max_norm):
    from minipar.optim import clip_coef
    return clip_coef(total, max_norm)


def _clipped(grad, max_norm=1.0):
    """clip_grad_norm_ on one parameter; raises (as the table wants) only if the gradient
    is what torch.nn.utils.clip_grad_norm_ leaves: g * clamp(max_norm / (norm + 1e-6), 1)."""
    import math
    import numpy as np
    from minipar.nn.parameter import Parameter
    from minipar.optim import clip_grad_norm_
    g = np.array(grad, dtype=np.float64)
    coef = max_norm / (math.sqrt(float(np.sum(g * g))) + 1e-6)
    coef = coef if math.isnan(coef) else min(1.0, coef)
    with np.errstate(invalid="ignore"):
        torch_result = g * coef
    with mp.device():
        p = Parameter("p", np.zeros(len(grad)))
        p.accumulate(g.copy())
        norm = clip_grad_norm_([p], max_norm)
    if np.array_equal(p.grad, torch_result, equal_nan=True):
        raise FloatingPointError(f"clipped as torch does: norm {norm}, grad {p.grad}")
    return p.grad


def _dropout_repeats():
    """Two forwards without a generator: the same masks would be the old, wrong answer."""
    import numpy as np
    from minipar.nn import GPT, GPTConfig
    from minipar.nn.saved import release_all
    cfg = GPTConfig(vocab_size=8, seq_len=4, hidden=8, num_heads=2, num_layers=1,
                    dropout=0.5)
    with mp.device():
        model = GPT(cfg)
        ids = np.arange(8).reshape(4, 2)
        masks = []
        for _ in range(2):
            _, cache = model.forward(ids, ids)
            masks.append(cache.embed.dropout.mask.copy())
            release_all(cache)
    if np.array_equal(*masks):
        return masks
    raise LookupError("fresh masks: step 2 differs from step 1")


MODEL_CASES: list[tuple[str, object, type, list[str]]] = [
    ("train:memory-over-the-device", lambda: _train(hidden=16384, num_heads=128,
                                                    num_layers=48, seq_len=2048),
     ValueError, ["needs about", "holds", "attention scores", "--micro-batches"]),
    ("train:hidden-1", lambda: _train(hidden=1, num_heads=1), ValueError,
     ["hidden = 1 cannot learn", "LayerNorm", "constant"]),
    ("train:one-step-all-warmup", lambda: _train(steps=1, warmup_steps=1), ValueError,
     ["lr 0", "warmup_steps = 0"]),
    ("train:nan-loss-float32", lambda: _train(steps=20, global_batch=8, seq_len=16,
                                              num_layers=1, hidden=32, num_heads=2, lr=1e4,
                                              min_lr=0.0, warmup_steps=3),
     FloatingPointError, ["loss became nan at step 7", "learning rate"]),
    ("train:nan-loss-float16", lambda: _train(steps=20, global_batch=8, seq_len=16,
                                              num_layers=1, hidden=32, num_heads=2, lr=1e4,
                                              min_lr=0.0, warmup_steps=3, dtype="float16"),
     FloatingPointError, ["loss became nan at step 3", "float16", "loss scale"]),
    ("config:init_std-nan", lambda: _gpt(init_std=float("nan")), ValueError,
     ["init_std must be a finite number > 0", "nan"]),
    ("config:init_std-inf", lambda: _gpt(init_std=float("inf")), ValueError,
     ["init_std must be a finite number > 0"]),
    ("config:layernorm_eps-0", lambda: _gpt(layernorm_eps=0.0), ValueError,
     ["layernorm_eps must be a finite number > 0"]),
    ("config:layernorm_eps-nan", lambda: _gpt(layernorm_eps=float("nan")), ValueError,
     ["layernorm_eps"]),
    ("config:dropout-string", lambda: _gpt(dropout="0.1"), ValueError,
     ["dropout must be in [0, 1)", "'0.1'"]),
    ("config:hidden-bool", lambda: _gpt(hidden=True, num_heads=1), ValueError,
     ["hidden must be a positive integer", "True"]),
    ("config:vocab_size-bool", lambda: _gpt(vocab_size=True), ValueError,
     ["vocab_size must be a positive integer"]),
    ("config:recompute_every-bool", lambda: _gpt(recompute_every=True), ValueError,
     ["recompute_every must be a positive integer"]),
    ("config:ffn_hidden-float", lambda: _gpt(ffn_hidden=2.5), ValueError,
     ["ffn_hidden must be a positive integer", "2.5"]),
    ("config:seed-negative", lambda: _gpt(seed=-1), ValueError,
     ["seed must be an integer >= 0"]),
    ("config:seed-float", lambda: _gpt(seed=1.5), ValueError, ["seed must be an integer"]),
    ("config:dtype-int8-type", lambda: _gpt(dtype=__import__("numpy").int8), ValueError,
     ["dtype must be one of", "floating point"]),
    ("config:dtype-None", lambda: _gpt(dtype=None), ValueError, ["dtype must be one of"]),
    ("config:tie_embeddings-string", lambda: _gpt(tie_embeddings="yes"), ValueError,
     ["tie_embeddings must be True or False"]),
    ("clip:inf-norm-zeroes-as-torch", lambda: _clipped([1.0, float("inf"), 3.0]),
     FloatingPointError, ["clipped as torch does", "norm inf"]),
    ("clip:nan-norm-poisons-as-torch", lambda: _clipped([1.0, float("nan")]),
     FloatingPointError, ["clipped as torch does", "norm nan"]),
    ("clip:max_norm-nan", lambda: _clip_coef(1.0, float("nan")), ValueError,
     ["max_norm must be > 0"]),
    ("dropout:fresh-masks-every-forward", _dropout_repeats, LookupError, ["fresh masks"]),
]


# ---- checkpoints and files ----------------------------------------------------------------
CHECKPOINT_CASES: list[tuple[str, object, type, list[str]]] = [
]


def _cases(table):
    return [pytest.param(fn, exc, words, id=name) for name, fn, exc, words in table]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, words", [pytest.param(a, w, id=" ".join(a)) for a, w in CLI_CASES])
def test_the_cli_refuses(argv, words, capsys):
    from minipar.cli import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fn, exc, words",
                         _cases(RUNTIME_CASES + MODEL_CASES + CHECKPOINT_CASES))
def test_the_library_refuses(fn, exc, words):
    with pytest.raises(exc) as e:
        fn()
    msg = str(getattr(e.value, "original", e.value))
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
