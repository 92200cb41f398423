"""ZeRO model-state memory and DP communication (Rajbhandari et al. 2020, section 5, Figure 1).

Every expected value is written out as arithmetic on the paper's formulas, never obtained
from the function under test.
"""

import pytest
from hypothesis import given, strategies as st

from minipar.plan import (dp_comm_elements, flat_padding, format_memory_report,
                          memory_report, model_state_bytes, zero_figure1)


# ---- Figure 1: Ψ = 7.5B, N_d = 64, K = 12 ------------------------------------------------
def test_figure1_exact_bytes():
    rows = zero_figure1()
    assert [r["stage"] for r in rows] == [0, 1, 2, 3]
    assert [r["bytes"] for r in rows] == [
        (2 + 2 + 12) * 7.5e9,                       # 120 GB
        2 * 7.5e9 + 2 * 7.5e9 + 12 * 7.5e9 / 64,    # 30 + 1.40625
        2 * 7.5e9 + (2 + 12) * 7.5e9 / 64,          # 15 + 1.640625
        (2 + 2 + 12) * 7.5e9 / 64,                  # 1.875
    ]
    assert [r["gb"] for r in rows] == [120.0, 31.40625, 16.640625, 1.875]


def test_figure1_matches_the_paper_rounding():
    rows = zero_figure1()
    # as printed in the paper's Figure 1
    assert [r["label"] for r in rows] == ["120GB", "31.4GB", "16.6GB", "1.9GB"]
    assert [round(r["gb"], 1) for r in rows] == [120.0, 31.4, 16.6, 1.9]
    assert [round(r["gb"], 2) for r in rows] == [120.0, 31.41, 16.64, 1.88]
    assert rows[0]["name"] == "DDP" and rows[3]["name"] == "ZeRO-3 (P_os+g+p)"


# ---- the per-category breakdown ----------------------------------------------------------
@pytest.mark.parametrize("stage, expected", [
    # Ψ = 1000, N = 4: 2Ψ = 2000, 2Ψ/N = 500, 12Ψ = 12000, 12Ψ/N = 3000
    (0, {"parameters": 2000, "gradients": 2000, "optimizer_states": 12000, "total": 16000}),
    (1, {"parameters": 2000, "gradients": 2000, "optimizer_states": 3000, "total": 7000}),
    (2, {"parameters": 2000, "gradients": 500, "optimizer_states": 3000, "total": 5500}),
    (3, {"parameters": 500, "gradients": 500, "optimizer_states": 3000, "total": 4000}),
])
def test_breakdown_by_category(stage, expected):
    assert model_state_bytes(1000, stage, 4) == expected


def test_seed_rules_per_gpu():
    # per GPU ≈ 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N; Ψ = 1e9, N = 8
    assert model_state_bytes(1e9, 1, 8)["total"] == 4e9 + 12e9 / 8
    assert model_state_bytes(1e9, 2, 8)["total"] == 2e9 + 14e9 / 8
    assert model_state_bytes(1e9, 3, 8)["total"] == 16e9 / 8


def test_other_byte_counts():
    # float32 training with plain Adam: 4-byte params and grads, K = 8 (m, v)
    # Ψ = 100, N = 2, ZeRO-2: 4*100 + 4*100/2 + 8*100/2 = 400 + 200 + 400
    assert model_state_bytes(100, 2, 2, k=8, param_bytes=4, grad_bytes=4) == {
        "parameters": 400, "gradients": 200, "optimizer_states": 400, "total": 1000}


# ---- padding -----------------------------------------------------------------------------
def test_flat_padding():
    assert flat_padding(10, 4) == 2      # 10 + 2 = 12 = 4 * 3
    assert flat_padding(12, 4) == 0
    assert flat_padding(1, 3) == 2
    assert flat_padding(7, 1) == 0


@pytest.mark.parametrize("stage, expected", [
    # Ψ = 10, padding 2, N = 4: Ψ' = 12; a replicated term holds 12 elements, a shard 12/4 = 3;
    # DDP pads nothing and holds Ψ = 10
    (0, {"parameters": 20, "gradients": 20, "optimizer_states": 120, "total": 160}),
    (1, {"parameters": 24, "gradients": 24, "optimizer_states": 36, "total": 84}),
    (2, {"parameters": 24, "gradients": 6, "optimizer_states": 36, "total": 66}),
    (3, {"parameters": 6, "gradients": 6, "optimizer_states": 36, "total": 48}),
])
def test_padding_replaces_psi_by_psi_plus_padding_at_stages_1_to_3(stage, expected):
    assert model_state_bytes(10, stage, 4, padding=2) == expected


def test_padding_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match=r"does not split evenly.*flat_padding\(psi, dp\) = 2"):
        model_state_bytes(10, 1, 4, padding=1)
    # padding may exceed the minimum by a multiple of N (alignment)
    assert model_state_bytes(10, 3, 4, padding=6)["parameters"] == 2 * (10 + 6) / 4


@pytest.mark.parametrize("bad, match", [
    (dict(stage=4), "stage must be 0"),
    (dict(dp=0), "dp .* must be an int >= 1"),
    (dict(psi=-1), "cannot be negative"),
    (dict(padding=-2), "padding must be"),
])
def test_bad_arguments_say_what_was_expected(bad, match):
    args = dict(psi=100, stage=1, dp=4) | bad
    with pytest.raises(ValueError, match=match):
        model_state_bytes(**args)


# ---- communication -----------------------------------------------------------------------
def test_comm_elements():
    # Ψ = 1200, N = 4: (N - 1)/N = 3/4
    assert dp_comm_elements(1200, 0, 4) == 2 * 1200 * 3 / 4 == 1800
    assert dp_comm_elements(1200, 1, 4) == 1800
    assert dp_comm_elements(1200, 2, 4) == 1800
    assert dp_comm_elements(1200, 3, 4) == 3 * 1200 * 3 / 4 == 2700
    assert dp_comm_elements(1200, 3, 4) / dp_comm_elements(1200, 0, 4) == 1.5
    assert [dp_comm_elements(1200, s, 1) for s in range(4)] == [0, 0, 0, 0]


def test_comm_elements_of_a_padded_flat_buffer():
    # Ψ = 10, padding 2, N = 4: stages >= 1 move the 12-element flat buffer
    assert dp_comm_elements(10, 0, 4) == 2 * 10 * 3 / 4
    assert dp_comm_elements(10, 2, 4, padding=2) == 2 * 12 * 3 / 4
    assert dp_comm_elements(10, 3, 4, padding=2) == 3 * 12 * 3 / 4


# ---- the order of the stages -------------------------------------------------------------
@given(psi=st.integers(1, 10**12), dp=st.integers(1, 4096), k=st.sampled_from([8, 12, 16]))
def test_each_stage_holds_no_more_than_the_one_before(psi, dp, k):
    t = [model_state_bytes(psi, s, dp, k=k)["total"] for s in range(4)]
    assert t[3] <= t[2] <= t[1] <= t[0] == (4 + k) * psi
    if dp == 1:
        assert t[0] == t[1] == t[2] == t[3]


@given(data=st.data(), dp=st.integers(1, 4096), k=st.sampled_from([8, 12, 16]))
def test_the_order_holds_with_padding_once_the_buffer_is_not_tiny(data, dp, k):
    # ZeRO-1 <= DDP needs 4p + kp/N <= kΨ(N-1)/N; with p <= N - 1 that holds for Ψ >= 4N/k + 1
    psi = data.draw(st.integers(dp, 10**12))
    pad = flat_padding(psi, dp)
    t = [model_state_bytes(psi, s, dp, k=k, padding=pad)["total"] for s in range(4)]
    assert t[3] <= t[2] <= t[1] <= t[0] == (4 + k) * psi


def test_padding_can_outweigh_sharding_for_a_tiny_buffer():
    # Ψ = 1, N = 2, padding 1: DDP 16 bytes; ZeRO-1 4*2 + 12*2/2 = 20 bytes
    assert model_state_bytes(1, 0, 2)["total"] == 16
    assert model_state_bytes(1, 1, 2, padding=1)["total"] == 20


@given(psi=st.integers(1, 10**12), dp=st.integers(2, 4096))
def test_zero3_moves_one_and_a_half_times_ddp(psi, dp):
    assert dp_comm_elements(psi, 3, dp) == pytest.approx(1.5 * dp_comm_elements(psi, 0, dp))
    assert dp_comm_elements(psi, 1, dp) == dp_comm_elements(psi, 2, dp) \
        == dp_comm_elements(psi, 0, dp)


# ---- the report a lesson prints ----------------------------------------------------------
def test_memory_report_rows_and_fit():
    rows = memory_report((7, 70, 405), (8, 64, 1024))
    assert len(rows) == 3 * 3 * 4
    by = {(r["params_billion"], r["dp"], r["stage"]): r for r in rows}
    r = by[7, 8, 0]
    assert (r["total"], r["gb"], r["fits"]) == (16 * 7e9, 112.0, False)
    r = by[7, 8, 1]
    assert (r["total"], r["fits"]) == (4 * 7e9 + 12 * 7e9 / 8, True)          # 38.5 GB
    assert by[70, 64, 2]["total"] == 2 * 70e9 + 14 * 70e9 / 64                 # 155.3 GB
    assert by[70, 64, 2]["fits"] is False
    assert (by[70, 64, 3]["total"], by[70, 64, 3]["fits"]) == (16 * 70e9 / 64, True)  # 17.5
    assert (by[405, 64, 3]["total"], by[405, 64, 3]["fits"]) == (16 * 405e9 / 64, False)
    assert (by[405, 1024, 3]["total"], by[405, 1024, 3]["fits"]) == (16 * 405e9 / 1024, True)
    assert by[7, 8, 0]["binary"] == "104.31 GiB"  # 112e9 / 2**30


def test_memory_report_capacity_and_single_values():
    rows = memory_report(13, 16, capacity_gb=40)
    assert [r["total"] for r in rows] == [16 * 13e9, 4 * 13e9 + 12 * 13e9 / 16,
                                          2 * 13e9 + 14 * 13e9 / 16, 16 * 13e9 / 16]
    assert [r["fits"] for r in rows] == [False, False, True, True]  # 208, 61.75, 37.4, 13


def test_format_memory_report():
    text = format_memory_report(memory_report((7, 70), (8, 64)))
    lines = text.splitlines()
    assert "80 GB" in lines[0]
    assert lines[1].split() == ["params", "N", "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    assert lines[2].split() == ["7B", "8", "112.00*", "38.50", "26.25", "14.00"]
    assert lines[5].split() == ["70B", "64", "1120.00*", "293.12*", "155.31*", "17.50"]
