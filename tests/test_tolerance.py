"""Tests for bisect_tui.core.tolerance: presets, parsing, verdicts, ratios."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bisect_tui.core.errors import ExitCode, UserError
from bisect_tui.core.metrics import compare
from bisect_tui.core.tolerance import (
    PRESETS,
    Tolerance,
    ToleranceSpec,
    Verdict,
    get_preset,
    judge,
    judge_arrays,
    parse_tolerance,
    worst_ratio,
)

R4 = np.array([1.0, 2.0, 3.0, 4.0])
T4 = np.array([1.0, 2.0, 3.0, 5.0])


# --------------------------------------------------------------------------- presets & parsing


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_parses(name):
    spec = parse_tolerance(name)
    assert spec.default == PRESETS[name].tolerance
    assert spec.default.name == name
    assert PRESETS[name].description and "\n" not in PRESETS[name].description
    assert spec.for_output("anything") is spec.default


def test_preset_values():
    fp32 = get_preset("fp32")
    assert (fp32.atol, fp32.rtol, fp32.min_cosine) == (1e-4, 1e-4, 0.99999)
    assert (get_preset("fp16").atol, get_preset("fp16").min_cosine) == (1e-2, 0.999)
    assert (get_preset("bf16").rtol, get_preset("bf16").min_cosine) == (5e-2, 0.99)
    int8 = get_preset("int8")
    assert (int8.atol, int8.min_cosine, int8.min_snr_db) == (None, 0.99, 20.0)
    art = get_preset("article")
    assert (art.mean_abs, art.mean_rel, art.min_cosine) == (1e-3, 1e-2, 0.99)
    ms = get_preset("msprobe")
    assert (ms.min_cosine, ms.max_abs) == (0.99, 1.0)
    assert (get_preset("torch-fp32").atol, get_preset("torch-fp32").rtol) == (1e-5, 1.3e-6)
    assert (get_preset("torch-fp16").atol, get_preset("torch-fp16").rtol) == (1e-5, 1e-3)
    assert get_preset("FP16") == get_preset("fp16")
    assert get_preset("torch_fp32") == get_preset("torch-fp32")


def test_default_preset_and_explicit_values_override():
    assert parse_tolerance(None).default == get_preset("fp32")
    tol = parse_tolerance("fp16", atol=1e-3, min_cosine=0.9999).default
    assert (tol.atol, tol.rtol, tol.min_cosine) == (1e-3, 1e-2, 0.9999)
    assert tol.name == "fp16+custom"


def test_per_output_overrides():
    spec = parse_tolerance(
        "fp32",
        overrides=[
            "logits:atol=1e-3,min_cosine=0.999",
            "probs:preset=fp16",
            "dense/BiasAdd:0:max_abs=0.5",
            "*/LayerNorm*:preset=bf16,min_cosine=none",
        ],
    )
    logits = spec.for_output("logits")
    assert (logits.atol, logits.rtol, logits.min_cosine) == (1e-3, 1e-4, 0.999)
    assert spec.for_output("probs") == get_preset("fp16")
    assert spec.for_output("dense/BiasAdd:0").max_abs == 0.5
    assert spec.for_output("dense/BiasAdd:0").atol == 1e-4  # inherits the global fp32
    ln = spec.for_output("enc/LayerNorm_1")
    assert (ln.atol, ln.min_cosine) == (5e-2, None)
    assert spec.for_output("other") == spec.default
    assert spec.unused(["logits", "enc/LayerNorm_1"]) == ["probs", "dense/BiasAdd:0"]


def test_exact_override_beats_glob():
    spec = parse_tolerance("fp32", overrides=["l*:atol=1", "logits:atol=2"])
    assert spec.for_output("logits").atol == 2.0
    assert spec.for_output("loss").atol == 1.0


def test_bad_preset_lists_presets():
    with pytest.raises(UserError) as ei:
        parse_tolerance("fp8")
    msg = str(ei.value)
    assert "'fp8'" in msg and "\n" not in msg
    for name in PRESETS:
        assert name in msg
    assert ei.value.code == ExitCode.USAGE
    with pytest.raises(UserError, match="fp16"):
        parse_tolerance("fp32", overrides=["x:preset=nope"])


@pytest.mark.parametrize(
    "override, needle",
    [
        ("logits", "expected OUTPUT:key=value"),
        ("logits:atol", "expected OUTPUT:key=value"),
        (":atol=1", "expected OUTPUT:key=value"),
        ("logits:foo=1", "unknown tolerance criterion 'foo'"),
        ("logits:atol=abc", "'abc' is not a number"),
        ("logits:topk=2.5", "not an integer"),
        ("logits:atol=-1", "must be >= 0"),
        ("logits:min_cosine=1.5", "must be <= 1"),
    ],
)
def test_bad_override_syntax(override, needle):
    with pytest.raises(UserError) as ei:
        parse_tolerance("fp32", overrides=[override])
    assert needle in str(ei.value)


def test_unknown_criterion_message_lists_valid_keys():
    with pytest.raises(UserError) as ei:
        parse_tolerance("fp32", overrides=["x:cosine=0.9"])
    for key in ("atol", "rtol", "min_cosine", "min_snr_db", "preset"):
        assert key in str(ei.value)


def test_duplicate_override_rejected():
    with pytest.raises(UserError, match="more than one"):
        parse_tolerance("fp32", overrides=["x:atol=1", "x:rtol=1"])


def test_negative_explicit_value_rejected():
    with pytest.raises(UserError, match="atol"):
        parse_tolerance("fp32", atol=-1e-3)


def test_spec_round_trip_through_json():
    spec = parse_tolerance("fp16", rtol=0.5, overrides=["a:preset=int8,topk=3,min_topk=0.9"])
    back = ToleranceSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back == spec
    assert back.for_output("a").topk == 3
    with pytest.raises(UserError, match="unknown tolerance field"):
        Tolerance.from_dict({"atoll": 1.0})


def test_describe():
    assert get_preset("fp16").describe() == "fp16: atol=0.01 rtol=0.01 min_cosine=0.999"
    assert Tolerance().describe() == "custom: (nothing checked)"


# --------------------------------------------------------------------------- judge


def test_judge_names_failing_criterion():
    v = judge(compare(R4, T4), Tolerance(max_abs=0.5, mean_abs=1.0))
    assert not v.passed
    assert [c.name for c in v.failed] == ["max_abs"]
    c = v.failed[0]
    assert (c.measured, c.limit, c.op, c.ok) == (1.0, 0.5, "<=", False)
    assert c.ratio == 2.0
    assert v.summary() == "FAIL: max_abs 1.0e+00 > 5e-01"
    assert [c.name for c in v.checked] == ["nan_inf", "max_abs", "mean_abs"]
    assert all(c.ok for c in v.checked if c.name != "max_abs")


def test_judge_several_failures_summary_counts_the_rest():
    v = judge(compare(R4, T4), Tolerance(max_abs=0.5, mean_abs=0.1, min_cosine=0.9999))
    assert [c.name for c in v.failed] == ["max_abs", "mean_abs", "min_cosine"]
    assert v.summary() == "FAIL: max_abs 1.0e+00 > 5e-01; +2 more"
    cos = v.failed[2]
    assert cos.op == ">=" and cos.text.startswith("cosine 0.99")
    assert cos.ratio == pytest.approx((1 - 34 / math.sqrt(1170)) / 1e-4)


def test_atol_rtol_text_and_share():
    r = np.ones(8)
    t = np.ones(8)
    t[0] = 1.0032
    m, v = judge_arrays(r, t, get_preset("fp32"))
    assert m["allclose_fail_share"] == 0.125 and m["allclose_fail_count"] == 1
    assert m["allclose_worst_excess"] == pytest.approx(0.0032 - 2e-4)
    assert m["allclose_max_ratio"] == pytest.approx(0.0032 / 2e-4)
    assert v.summary() == (
        "FAIL: max_abs 3.2e-03 > 1e-04 "
        "(atol/rtol: 12.5% of elements outside atol=1e-04 + rtol=1e-04*|ref|)"
    )
    assert [c.name for c in v.failed] == ["atol/rtol"]  # cosine is still > 0.99999
    assert v.ratio == pytest.approx(16.0)
    # judge() given the arrays reaches the same verdict from plain compare() metrics
    v2 = judge(compare(r, t), get_preset("fp32"), reference=r, test=t)
    assert v2.to_dict() == v.to_dict()


def test_atol_only_treats_rtol_as_zero():
    r = np.array([100.0, 1.0])
    t = np.array([100.05, 1.0])
    assert not judge_arrays(r, t, Tolerance(atol=0.01))[1].passed
    assert judge_arrays(r, t, Tolerance(rtol=1e-3))[1].passed  # 0.05 <= 1e-3*100


def test_max_fail_share_allows_some_elements():
    r = np.ones(8)
    t = np.ones(8)
    t[0] = 2.0
    m, v = judge_arrays(r, t, Tolerance(atol=1e-3, max_fail_share=0.2))
    assert v.passed and v.checked[1].name == "atol/rtol"
    assert v.ratio == pytest.approx(0.125 / 0.2)
    assert "allowed 20.0%" in v.checked[1].text
    _, v = judge_arrays(r, t, Tolerance(atol=1e-3, max_fail_share=0.1))
    assert not v.passed and v.failed[0].name == "atol/rtol"


def test_judge_without_arrays_needs_allclose_metrics():
    with pytest.raises(ValueError, match="judge_arrays"):
        judge(compare(R4, T4), get_preset("fp32"))
    m, _ = judge_arrays(R4, T4, Tolerance(atol=1e-3))
    with pytest.raises(ValueError, match="atol=0.01"):
        judge(m, Tolerance(atol=1e-2))  # metrics were made for another atol


def test_nan_in_test_always_fails():
    r = np.array([1.0, 2.0, 3.0])
    t = np.array([1.0, np.nan, 3.0])
    m, v = judge_arrays(r, t, Tolerance())  # nothing else checked
    assert m["nan_mismatch"] == 1
    assert not v.passed and v.failed[0].name == "nan_inf"
    assert v.summary().startswith("FAIL: nan_inf: test has 1 NaN / 0 Inf vs reference 0 NaN")
    assert v.ratio == math.inf
    # Same NaN position on both sides is agreement, not a failure.
    assert judge_arrays(np.array([1.0, np.nan]), np.array([1.0, np.nan]), get_preset("fp32"))[1].passed


def test_inf_in_test_fails():
    _, v = judge_arrays(np.array([1.0, 2.0]), np.array([1.0, np.inf]), get_preset("bf16"))
    assert [c.name for c in v.failed][0] == "nan_inf"


def test_no_comparable_elements_fails_numeric_criteria():
    r = np.array([np.nan, 1.0])
    t = np.array([np.nan, np.nan])
    v = judge(compare(r, t), Tolerance(max_abs=1.0))
    assert {c.name for c in v.failed} == {"nan_inf", "max_abs"}
    assert "nothing to measure" in v.failed[1].text


def test_snr_criterion_and_ratio():
    v = judge(compare(R4, T4), get_preset("int8"))
    snr = next(c for c in v.checked if c.name == "min_snr_db")
    assert not snr.ok and snr.measured == pytest.approx(10 * math.log10(30))
    assert snr.text == "snr 14.8 dB < 20 dB"
    # error power 1/30 of the signal vs 1/100 allowed
    assert snr.ratio == pytest.approx(100 / 30)


def test_topk_criterion():
    ref = np.array([[5.0, 4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    test = np.array([[5.0, 4.0, 3.0, 1.0, 2.0], [5.0, 2.0, 3.0, 4.0, 1.0]])
    m, v = judge_arrays(ref, test, Tolerance(min_topk=0.9, topk=2))
    assert m["topk"] == 2 and m["topk_agreement"] == 0.75
    assert [c.name for c in v.failed] == ["min_topk"]
    assert v.failed[0].text == "top-2 agreement 0.7500 < 0.9"
    assert v.failed[0].ratio == pytest.approx(0.25 / 0.1)
    assert judge_arrays(ref, test, Tolerance(min_topk=0.7, topk=2))[1].passed
    with pytest.raises(ValueError, match="topk=5"):
        judge(compare(ref, test, topk=2), Tolerance(min_topk=0.5))  # default k is 5
    # no class axis: criterion skipped, not silently passed as measured
    _, v = judge_arrays(np.ones((4, 1)), np.ones((4, 1)), Tolerance(min_topk=0.9))
    assert v.passed and v.skipped and v.skipped[0].startswith("min_topk")


def test_relative_criteria_use_tolerance_floor():
    r = np.array([0.0, 100.0])
    t = np.array([1e-3, 100.0])
    # default floor 0.1: rel error 1e-2 passes max_rel=0.05
    assert judge_arrays(r, t, Tolerance(max_rel=0.05))[1].passed
    m, v = judge_arrays(r, t, Tolerance(max_rel=0.05, rel_floor=1e-6))
    assert m["rel_floor"] == 1e-6 and not v.passed
    assert "rel. floor 1e-06" in v.failed[0].text
    with pytest.raises(ValueError, match="rel_floor"):
        judge(compare(r, t), Tolerance(max_rel=0.05, rel_floor=1e-6))


def test_text_has_enough_digits_near_the_limit():
    v = judge(compare(np.zeros(1), np.array([1.00004e-4])), Tolerance(max_abs=1e-4))
    assert v.summary() == "FAIL: max_abs 1.00004e-04 > 1e-04"


def test_empty_tensor_passes():
    v = judge(compare(np.zeros((0, 3)), np.zeros((0, 3))), Tolerance(max_abs=0.0, min_cosine=1.0))
    assert v.passed


def test_worst_ratio_agrees_with_verdict():
    rng = np.random.default_rng(5)
    r = rng.standard_normal(2000)
    for name in ("fp32", "fp16", "bf16", "int8", "article", "msprobe"):
        tol = get_preset(name)
        for noise in (1e-7, 1e-5, 1e-3, 1e-2, 1e-1, 1.0):
            t = r + rng.standard_normal(r.size) * noise
            m, v = judge_arrays(r, t, tol)
            ratio = worst_ratio(m, tol)
            assert ratio == v.ratio
            assert (ratio > 1) == (not v.passed), (name, noise, ratio, v.summary())
    # ranking: more noise, higher ratio
    tol = get_preset("fp16")
    ratios = [worst_ratio(judge_arrays(r, r + 1e-3 * s, tol)[0], tol) for s in (1, 5, 50)]
    assert ratios == sorted(ratios) and ratios[-1] > 1 > ratios[0]


def test_verdict_round_trip():
    m, v = judge_arrays(R4, T4, get_preset("article"))
    data = json.loads(json.dumps(v.to_dict()))
    assert data["passed"] is False and data["failed"] == [c.name for c in v.failed]
    back = Verdict.from_dict(data)
    assert back.summary() == v.summary() and back.ratio == v.ratio


# --------------------------------------------------------------------------- one declaration per figure


def test_every_declared_figure_is_reported_judged_and_bounded_by_a_field():
    """metrics.catalog is the one list: compare() reports its figures in its order,
    each declared bound is a Tolerance field that validates with the declared
    limits, and judge() checks the bounds in the declared order."""
    import dataclasses

    from bisect_tui.core.metrics.catalog import BOUNDED, METRICS, TABLE
    from bisect_tui.core.tolerance import CRITERIA

    m = compare(R4, T4, topk=2)
    declared = [d.key for d in METRICS]
    assert [k for k in m if k in declared] == declared
    fields = [f.name for f in dataclasses.fields(Tolerance)]
    assert sorted(fields) == sorted(CRITERIA + ("name",))
    assert {d.bound.criterion for d in BOUNDED} <= set(fields)
    assert [d.label for d in TABLE] == ["max abs", "mean abs", "max rel", "cosine", "SNR dB"]
    every = Tolerance(max_abs=0.5, mean_abs=0.5, max_rel=0.5, mean_rel=0.5, min_cosine=0.5, min_snr_db=5.0,
                      min_topk=0.5, topk=2)
    names = [c.name for c in judge(m, every).checked]
    assert names == ["nan_inf"] + [d.bound.criterion for d in BOUNDED]
    for d in BOUNDED:
        if d.bound.at_most is not None:
            with pytest.raises(UserError, match=f"{d.bound.criterion}=2 must be <= 1"):
                Tolerance(**{d.bound.criterion: 2})
        if d.bound.at_least is not None:
            with pytest.raises(UserError, match=f"{d.bound.criterion}=-1 must be >= 0"):
                Tolerance(**{d.bound.criterion: -1})
    assert Tolerance(min_snr_db=-5.0).min_snr_db == -5.0  # an SNR limit may be negative


def test_verdict_words_come_from_the_declaration():
    m = compare(R4, T4, topk=2)
    v = judge(m, Tolerance(max_rel=0.01, min_cosine=0.9999, min_snr_db=40.0, min_topk=1.0, topk=2))
    texts = {c.name: c.text for c in v.checked}
    assert texts["max_rel"] == "max_rel 2.5e-01 > 1e-02 (rel. floor 4e-03)"
    assert texts["min_cosine"] == f"cosine {m['cosine']:.4f} < 0.9999"
    assert texts["min_snr_db"] == f"snr {m['snr_db']:.1f} dB < 40 dB"
    assert texts["min_topk"] == "top-2 agreement 1.0000 >= 1"
