"""Tests for bisect_tui.core.metrics with hand-computed expectations."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from bisect_tui.core.metrics import arrays, compare, hist_counts, summarize


def _plain(obj) -> None:
    """Assert the structure holds only JSON-able Python types (no numpy scalars)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert isinstance(k, str)
            _plain(v)
    elif isinstance(obj, list):
        for v in obj:
            _plain(v)
    else:
        assert obj is None or type(obj) in (bool, int, float, str), (obj, type(obj))


def test_known_arrays_hand_computed():
    r = np.array([1.0, 2.0, 3.0, 4.0])
    t = np.array([1.0, 2.0, 3.0, 5.0])
    m = compare(r, t)
    assert m["shape"] == [4] and m["numel"] == 4 and m["n_compared"] == 4
    assert m["max_abs"] == 1.0
    assert m["mean_abs"] == 0.25
    assert m["rmse"] == pytest.approx(0.5)
    assert m["cosine"] == pytest.approx(34 / math.sqrt(30 * 39), rel=1e-14)
    assert m["snr_db"] == pytest.approx(10 * math.log10(30.0), rel=1e-14)
    # floor = max(1e-6, 1e-3 * 4) = 0.004, below every |r|: plain relative error
    assert m["rel_floor"] == pytest.approx(0.004)
    assert m["max_rel"] == pytest.approx(0.25)
    assert m["mean_rel"] == pytest.approx(0.0625)
    assert m["within_0.1pct"] == 0.75 and m["within_0.5pct"] == 0.75
    assert m["worst"][0] == {"index": [3], "reference": 4.0, "test": 5.0, "abs_err": 1.0}
    # ties (zero error) in index order
    assert [w["index"] for w in m["worst"]] == [[3], [0], [1], [2]]
    assert m["nan_mismatch"] == 0 and m["nan_test"] == 0 and m["inf_ref"] == 0
    _plain(m)
    json.dumps(m)


def test_zero_arrays_cosine_and_snr():
    z = np.zeros(4)
    same = compare(z, z)
    assert same["cosine"] == 1.0 and same["snr_db"] == math.inf and same["max_abs"] == 0.0
    assert "Infinity" in json.dumps(same)
    one_zero = compare(z, np.array([0.0, 1.0, 0.0, 0.0]))
    assert one_zero["cosine"] == 0.0 and one_zero["snr_db"] == -math.inf
    assert compare(np.array([1.0, 0.0]), z[:2])["cosine"] == 0.0


def test_opposite_vectors_cosine_minus_one():
    r = np.array([1.0, -2.0, 3.0])
    assert compare(r, -r)["cosine"] == pytest.approx(-1.0)


def test_relative_floor_ignores_near_zero_references():
    r = np.array([0.0, 1e-9, 100.0])
    t = np.array([1e-6, 2e-9, 100.0])
    m = compare(r, t)
    assert m["rel_floor"] == pytest.approx(0.1)  # 1e-3 * max|r|
    assert m["max_rel"] == pytest.approx(1e-5)  # 1e-6 / 0.1, not 1e-6 / 0
    # A tiny explicit floor shows the meaningless errors the default avoids.
    raw = compare(r, t, rel_floor=1e-12)
    assert raw["rel_floor"] == 1e-12
    assert raw["max_rel"] == pytest.approx(1e6)


def test_relative_floor_minimum_for_tiny_tensors():
    r = np.array([1e-8, -2e-8])
    m = compare(r, r * 2)
    assert m["rel_floor"] == 1e-6  # 1e-3 * 2e-8 is below the absolute minimum
    assert m["max_rel"] == pytest.approx(2e-8 / 1e-6)


def test_relative_floor_must_be_positive():
    with pytest.raises(ValueError, match="rel_floor"):
        compare(np.ones(2), np.ones(2), rel_floor=0.0)


def test_fp16_test_vs_fp32_reference_computed_in_float64():
    r = np.array([0.1, 1 / 3, 1000.1], dtype=np.float32)
    t = r.astype(np.float16)
    m = compare(r, t)
    assert m["ref_dtype"] == "float32" and m["test_dtype"] == "float16"
    # float16(1000.1) == 1000.0 (spacing 0.5); float32(1000.1) == 1000.0999755859375
    assert float(t[2]) == 1000.0
    assert m["max_abs"] == pytest.approx(0.0999755859375, rel=1e-12)
    assert m["worst"][0]["index"] == [2]
    errs = [abs(float(a) - float(b)) for a, b in zip(t, r)]
    assert errs[1] == pytest.approx(8.139014244e-05, rel=1e-6)
    assert m["mean_abs"] == pytest.approx(sum(errs) / 3, rel=1e-12)


def test_bfloat16_and_int_and_bool_inputs():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    r = np.array([1.0, 3.14159], dtype=np.float32)
    t = r.astype(ml_dtypes.bfloat16)
    m = compare(r, t)
    assert m["test_dtype"] == "bfloat16"
    assert m["max_abs"] == pytest.approx(abs(3.140625 - float(r[1])), rel=1e-9)
    ib = compare(np.array([True, False, True]), np.array([1, 0, 0], dtype=np.int64))
    assert ib["max_abs"] == 1.0 and ib["mean_abs"] == pytest.approx(1 / 3)


def test_unsupported_dtype_raises():
    with pytest.raises(ValueError, match="complex"):
        compare(np.ones(2, dtype=np.complex64), np.ones(2, dtype=np.complex64))
    with pytest.raises(ValueError, match="cannot be compared"):
        compare(np.array(["a", "b"]), np.array(["a", "b"]))


def test_shape_alignment():
    r = np.arange(6.0).reshape(1, 6)
    m = compare(r, np.arange(6.0) + 1)
    assert m["shape"] == [1, 6] and m["max_abs"] == 1.0
    assert m["worst"][0]["index"][0] == 0 and len(m["worst"][0]["index"]) == 2
    with pytest.raises(ValueError) as ei:
        compare(np.zeros((2, 3)), np.zeros((3, 2)))
    assert "(2, 3)" in str(ei.value) and "(3, 2)" in str(ei.value)
    with pytest.raises(ValueError, match="shape mismatch"):
        compare(np.zeros(4), np.zeros(5))


def test_nan_in_test_where_reference_finite():
    r = np.array([1.0, 2.0, 3.0, np.nan])
    t = np.array([1.0, np.nan, 3.5, np.nan])
    m = compare(r, t)
    assert m["nan_ref"] == 1 and m["nan_test"] == 2
    assert m["nan_mismatch"] == 1  # index 3 is NaN on both sides: not a mismatch
    assert m["n_compared"] == 2
    assert m["max_abs"] == 0.5 and m["worst"][0]["index"] == [2]
    assert all(not math.isnan(w["test"]) for w in m["worst"])


def test_inf_mismatch_counts_sign():
    r = np.array([np.inf, -np.inf, 1.0, np.inf])
    t = np.array([np.inf, np.inf, np.inf, 2.0])
    m = compare(r, t)
    assert m["inf_ref"] == 3 and m["inf_test"] == 3
    assert m["inf_mismatch"] == 3  # sign flip, inf vs finite twice; index 0 agrees
    assert m["n_compared"] == 0


def test_no_finite_positions_gives_nan_metrics():
    m = compare(np.full(3, np.nan), np.full(3, np.nan))
    assert m["n_compared"] == 0 and m["nan_mismatch"] == 0
    for key in ("max_abs", "mean_abs", "rmse", "cosine", "snr_db", "within_0.1pct"):
        assert math.isnan(m[key]), key
    assert m["worst"] == [] and m["error_hist"] == {"edges": [], "counts": []}
    json.dumps(m)


def _logits():
    ref = np.array([[5.0, 4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    test = np.array([[5.0, 4.0, 3.0, 1.0, 2.0], [5.0, 2.0, 3.0, 4.0, 1.0]])
    return ref, test


def test_topk_agreement_crafted_logits():
    ref, test = _logits()
    m = compare(ref, test, topk=2)
    # row 0: same argmax, same top-2; row 1: argmax 4 vs 0, top-2 {4,3} vs {0,3}
    assert m["topk"] == 2
    assert m["top1_agreement"] == 0.5
    assert m["topk_agreement"] == 0.75
    m3 = compare(ref, test, topk=3)
    # row 1 top-3: {4,3,2} vs {0,3,2}
    assert m3["topk_agreement"] == pytest.approx((1 + 2 / 3) / 2)
    # class axis first: same result on the transposed tensors
    mt = compare(ref.T, test.T, topk=2, class_axis=0)
    assert mt["top1_agreement"] == 0.5 and mt["topk_agreement"] == 0.75
    # k >= classes: every class is in both sets
    assert compare(ref, test, topk=9)["topk_agreement"] == 1.0


def test_topk_only_when_requested_and_applicable():
    ref, test = _logits()
    assert "top1_agreement" not in compare(ref, test)
    m = compare(np.ones((3, 1)), np.ones((3, 1)), topk=1)
    assert m["top1_agreement"] is None and m["topk_agreement"] is None
    with pytest.raises(ValueError, match="class_axis"):
        compare(ref, test, topk=1, class_axis=2)


def test_histograms_share_edges_and_count_everything():
    rng = np.random.default_rng(1)
    r = rng.standard_normal(1000)
    t = r * 1.5 + 0.1
    t[:10] = r[:10]  # exact matches -> clamped to log10(1e-12)
    m = compare(r, t, hist_bins=8)
    assert m["ref_hist"]["edges"] == m["test_hist"]["edges"]
    assert len(m["ref_hist"]["edges"]) == 9 and len(m["ref_hist"]["counts"]) == 8
    assert sum(m["ref_hist"]["counts"]) == 1000 and sum(m["test_hist"]["counts"]) == 1000
    assert m["ref_hist"]["edges"][0] == min(r.min(), t.min())
    assert m["ref_hist"]["edges"][-1] == max(r.max(), t.max())
    eh = m["error_hist"]
    assert eh["edges"][0] == -12.0 and eh["counts"][0] >= 10 and sum(eh["counts"]) == 1000
    assert eh["edges"][-1] == pytest.approx(math.log10(m["max_abs"]))


def test_chunked_result_matches_single_chunk(monkeypatch):
    """Streaming must not change any number: compare with chunks of 7 elements."""
    rng = np.random.default_rng(2)
    r = rng.standard_normal((13, 11)).astype(np.float32)
    t = (r + rng.standard_normal(r.shape) * 1e-2).astype(np.float32)
    t[3, 4] = np.nan
    t[7, 7] += 3.0
    whole = compare(r, t, topk=3, hist_bins=5)
    monkeypatch.setattr(arrays, "CHUNK", 7)
    assert len(arrays.spans(r.size)) == 21  # it really streams
    chunked = compare(r, t, topk=3, hist_bins=5)
    assert chunked["worst"] == whole["worst"]
    assert chunked["worst"][0]["index"] == [7, 7]
    for key in ("max_abs", "mean_abs", "rmse", "max_rel", "mean_rel", "cosine", "snr_db"):
        assert chunked[key] == pytest.approx(whole[key], rel=1e-12), key
    for key in ("error_hist", "ref_hist", "test_hist", "nan_mismatch", "top1_agreement",
                "topk_agreement", "within_0.1pct"):
        assert chunked[key] == whole[key], key


def test_huge_and_tiny_magnitudes_do_not_overflow():
    r = np.array([1e200, 2e200])
    t = np.array([1e200, 2.2e200])
    m = compare(r, t)
    assert m["cosine"] == pytest.approx(5.4 / math.sqrt(5 * 5.84), rel=1e-12)
    assert m["snr_db"] == pytest.approx(10 * math.log10(5 / 0.04), rel=1e-12)
    assert m["rmse"] == pytest.approx(0.2e200 / math.sqrt(2), rel=1e-12)
    tiny = compare(np.array([1e-200, 2e-200]), np.array([1e-200, 2.2e-200]))
    assert tiny["cosine"] == pytest.approx(m["cosine"], rel=1e-12)
    assert tiny["snr_db"] == pytest.approx(m["snr_db"], rel=1e-12)


def test_histogram_of_nearly_constant_values():
    r = np.array([1.0, np.nextafter(1.0, 2.0), 1.0])
    m = compare(r, r, hist_bins=20)  # numpy alone: "Too many bins for data range"
    edges = m["ref_hist"]["edges"]
    assert len(edges) == 21 and all(a < b for a, b in zip(edges, edges[1:]))
    assert sum(m["ref_hist"]["counts"]) == 3
    assert hist_counts(r, 20, 1.0, 1.0) == [0] * 10 + [3] + [0] * 9


def test_float64_overflowing_difference():
    r = np.array([-1.7e308, 1.7e308])
    m = compare(r, -r)
    assert m["max_abs"] == math.inf and m["snr_db"] == -math.inf
    assert m["cosine"] == -1.0
    assert m["ref_hist"] == {"edges": [], "counts": []}  # span exceeds float64
    assert sum(m["error_hist"]["counts"]) == 2
    json.dumps(m)


def test_ten_million_elements():
    rng = np.random.default_rng(3)
    r = rng.standard_normal((1000, 10000), dtype=np.float32)
    t = r.copy()
    t[123, 4567] += np.float32(0.5)
    t[999, 9999] -= np.float32(0.25)
    m = compare(r, t)
    assert m["numel"] == 10_000_000 and m["n_compared"] == 10_000_000
    expected = abs(float(t[123, 4567]) - float(r[123, 4567]))
    assert m["max_abs"] == expected
    assert m["worst"][0]["index"] == [123, 4567]
    assert m["worst"][1]["index"] == [999, 9999]
    assert m["worst"][2]["abs_err"] == 0.0
    assert m["within_0.1pct"] == pytest.approx(1 - 2e-7)


def test_summarize_stats():
    s = summarize(np.array([1.0, 2.0, 3.0, np.nan, np.inf, 0.0], dtype=np.float32))
    assert (s["min"], s["max"], s["abs_max"]) == (0.0, 3.0, 3.0)
    assert s["mean"] == 1.5
    assert s["std"] == pytest.approx(math.sqrt(1.25))
    assert (s["nan"], s["inf"], s["zeros"], s["numel"]) == (1, 1, 1, 6)
    assert s["zero_share"] == pytest.approx(1 / 6)
    assert s["dtype"] == "float32" and s["shape"] == [6]
    _plain(s)
    empty = summarize(np.array([np.nan]))
    assert math.isnan(empty["mean"]) and math.isnan(empty["std"]) and empty["nan"] == 1


def test_summarize_chunked_std_is_stable(monkeypatch):
    rng = np.random.default_rng(4)
    x = 1e8 + rng.standard_normal(5000)
    monkeypatch.setattr(arrays, "CHUNK", 333)
    assert len(arrays.spans(x.size)) == 16
    s = summarize(x)
    assert s["mean"] == pytest.approx(float(np.mean(x)), rel=1e-15)
    assert s["std"] == pytest.approx(float(np.std(x)), rel=1e-9)


def test_hist_counts():
    x = np.array([0.0, 0.5, 1.0, 2.0, np.nan])
    assert hist_counts(x, 2, 0.0, 1.0) == [1, 2]  # 2.0 outside, NaN dropped
    assert hist_counts(np.array([3.0, 3.0]), 1, 3.0, 3.0) == [2]


def test_core_imports_no_engine_or_ui():
    """The comparison and the judgement load numpy and bisect_tui's core only."""
    code = (
        "import sys, bisect_tui.core.metrics, bisect_tui.core.tolerance\n"
        "print(' '.join(sorted(m for m in sys.modules if '.' not in m)))\n"
    )
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert {"numpy", "bisect_tui"} <= loaded  # the imports really ran
    assert not loaded & {"onnxruntime", "onnx", "openvino", "tensorrt", "torch", "textual"}


def test_many_small_tensors_judged_together_match_one_at_a_time():
    """tolerance.judge_many (metrics.compare_many, segment reductions over one
    concatenation) gives each pair the verdict, ratio and figures of judge_arrays
    alone, to rounding; pairs it does not take fall back and are exactly equal."""
    from bisect_tui.core.metrics import compare_many
    from bisect_tui.core.tolerance import PRESETS, Tolerance, judge_arrays, judge_many

    rng = np.random.default_rng(7)
    base = [rng.standard_normal((2, 8, 32)).astype(np.float32) for _ in range(6)]
    pairs = [(b, b + rng.standard_normal(b.shape).astype(np.float32) * s)
             for b, s in zip(base, (0.0, 1e-7, 1e-5, 1e-4, 3e-4, 1e-2))]
    pairs += [
        (np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32)),  # both zero: cosine 1
        (np.zeros((3,), np.float32), np.ones((3,), np.float32)),  # zero reference
        (np.full((5,), 1e-8, np.float32), np.full((5,), 2e-8, np.float32)),  # below the rel. floor
        (-base[0], base[0]),  # opposite
        (base[1].astype(np.float64), base[1].astype(np.float16).astype(np.float64)),
        (np.array([1.0, np.nan], np.float32), np.array([1.0, np.nan], np.float32)),  # NaN: alone
        (np.arange(6).reshape(2, 3), np.arange(6).reshape(2, 3)),  # integers: alone
        (rng.standard_normal(70000).astype(np.float32),) * 2,  # large: alone
        (np.full((3,), 1e200), np.full((3,), 1e200)),  # compare() rescales these: alone
    ]
    taken = compare_many(pairs, allclose=(1e-4, 1e-4))
    assert [m is None for m in taken[-4:]] == [True] * 4 and all(m is not None for m in taken[:-4])
    tols = [PRESETS[k].tolerance for k in ("fp32", "fp16", "int8", "article", "msprobe", "torch-fp32")]
    tols += [Tolerance(max_rel=1e-3, rel_floor=1e-3, max_fail_share=0.01, atol=1e-5, rtol=1e-5)]
    for tol in tols:
        many = judge_many(pairs, tol)
        for (r, t), (m, v) in zip(pairs, many):
            m1, v1 = judge_arrays(r, t, tol, histograms=False)
            assert v.passed == v1.passed, (tol.name, m1["max_abs"])
            # rounding: identical tensors may give cosine 1 - 1e-16, a ratio of 1e-11 instead of 0
            assert v.ratio == pytest.approx(v1.ratio, rel=1e-9, abs=1e-9)
            assert set(m) == set(m1), (tol.name, set(m) ^ set(m1))  # the same figures, allclose_* or not
            for k in ("max_abs", "mean_abs", "rmse", "max_rel", "mean_rel", "rel_floor", "cosine", "snr_db",
                      "within_0.1pct", "allclose_fail_count", "allclose_max_ratio", "numel", "nan_mismatch"):
                if k.startswith("allclose_") and not tol.checks_allclose:
                    continue
                assert m[k] == pytest.approx(m1[k], rel=1e-9, abs=1e-14), (tol.name, k)


def test_many_pairs_give_the_same_figures_in_small_batches(monkeypatch):
    """compare_many works in batches of whole pairs (one pass over 7,000 probe pairs
    peaked at 7.5 GB): every batch size gives the same figures for every pair."""
    import json

    from bisect_tui.core.metrics import batched

    rng = np.random.default_rng(11)
    pairs = []
    for k in range(120):
        r = rng.standard_normal(int(rng.integers(1, 900))).astype(np.float32)
        pairs.append((r, r + rng.standard_normal(r.shape).astype(np.float32) * 10.0 ** -(k % 6)))
    pairs.insert(40, (np.array([1.0, np.nan], np.float32),) * 2)  # not taken: None at its place
    monkeypatch.setattr(batched, "BATCH_ELEMENTS", 1 << 40)
    whole = batched.compare_many(pairs, allclose=(1e-4, 1e-4))
    assert whole[40] is None and sum(m is not None for m in whole) == 120
    for size in (1, 700, 5000):
        monkeypatch.setattr(batched, "BATCH_ELEMENTS", size)
        assert json.dumps(batched.compare_many(pairs, allclose=(1e-4, 1e-4))) == json.dumps(whole), size
