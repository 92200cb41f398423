"""Grader for lesson 00: your byte counts against minipar.plan's, over many model sizes."""

from hypothesis import given, strategies as st

from minipar.course.grading import SETTINGS, exercise, expect_close, expect_equal
from minipar.plan import activation_bytes_per_layer, model_state_bytes

# parameter counts that are not round, so that no formula is right by accident
PSI = st.integers(1, 10**12).map(lambda k: k * 1024)  # divisible by every n below
N = st.sampled_from([1, 2, 3, 4, 8, 16, 64, 1024])


@exercise("0.1", "model-state bytes per GPU for DDP and ZeRO-1/2/3")
@SETTINGS
@given(psi=PSI, stage=st.integers(0, 3), n=N)
def check_model_state_bytes(impl, psi, stage, n):
    expected = model_state_bytes(psi, stage, n)["total"]
    expect_close(impl.model_state_bytes_per_gpu(psi, stage, n), expected, rtol=1e-12,
                 atol=0, what=f"model_state_bytes_per_gpu(psi={psi}, stage={stage}, n={n})",
                 hint="weights 2, gradients 2 and optimizer 12 bytes a parameter; stage k "
                      "shards the last k of (optimizer, gradients, weights) over n")


@exercise("0.2", "activation bytes of a whole model, per recomputation mode")
@SETTINGS
@given(s=st.integers(1, 8192), b=st.integers(1, 16), heads=st.integers(1, 64),
       head_dim=st.integers(1, 256), layers=st.integers(1, 128),
       recompute=st.sampled_from(["none", "selective", "full"]))
def check_activation_bytes(impl, s, b, heads, head_dim, layers, recompute):
    h = heads * head_dim
    expected = layers * activation_bytes_per_layer(s, b, h, heads, recompute)
    expect_close(impl.activation_bytes(s, b, h, heads, layers, recompute), expected,
                 rtol=1e-12, atol=0,
                 what=f"activation_bytes(s={s}, b={b}, h={h}, a={heads}, layers={layers}, "
                      f"recompute={recompute!r})",
                 hint="per layer: sbh(34 + 5as/h), 34sbh (selective), 2sbh (full)")


@exercise("0.3", "the fewest GPUs whose memory holds the model states")
@SETTINGS
@given(psi=st.integers(1, 2000).map(lambda k: k * 10**8 + 7), stage=st.integers(0, 3),
       gpu_gb=st.sampled_from([16, 24, 40, 80, 141]))
def check_min_gpus(impl, psi, stage, gpu_gb):
    gpu = gpu_gb * 1e9
    fits = [n for n in range(1, 4097) if model_state_bytes(psi, stage, n)["total"] <= gpu]
    expected = fits[0] if fits else None
    if expected is None and stage == 3:
        return  # beyond 4096 GPUs: not checked
    expect_equal(impl.min_gpus(psi, stage, gpu), expected,
                 what=f"min_gpus(psi={psi}, stage={stage}, gpu_bytes={gpu:g})",
                 hint="DDP never gets smaller with n; ZeRO-1/2 have a floor of 4Ψ/2Ψ bytes "
                      "that no n divides")
