"""Property tests for the metrics and the tolerance verdicts (hypothesis).

The metrics decide every verdict the tool reports, so they must hold for any
tensor a model can produce: NaN, Inf, denormals, signed zeros, values near
float32's limits, empty tensors. Each property is checked against numbers
computed here independently (float64 numpy), never against the code itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bisect_tui.core.metrics import compare
from bisect_tui.core.tolerance import Tolerance, judge_arrays

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

F32_MAX = float(np.finfo(np.float32).max)
DENORMAL = float(np.finfo(np.float32).smallest_subnormal)

# every float32 value class: NaN, +-Inf, denormals, +-0, huge, ordinary
special = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, DENORMAL, -DENORMAL, F32_MAX, -F32_MAX,
                           1e-38, 1.0, -1.0])
any_f32 = st.one_of(special, st.floats(width=32, allow_nan=True, allow_infinity=True))
finite_f32 = st.floats(min_value=-2.0**100, max_value=2.0**100, width=32, allow_nan=False, allow_infinity=False)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)


def pair(elements, shape_strategy=shapes):
    """Two float32 arrays of one shape (ref, test)."""
    return shape_strategy.flatmap(lambda s: st.tuples(
        hnp.arrays(np.float32, s, elements=elements), hnp.arrays(np.float32, s, elements=elements)))


@SETTINGS
@given(pair(any_f32))
def test_counts_of_nan_and_inf_match_numpy(arrs):
    ref, test = arrs
    m = compare(ref, test)
    assert m["numel"] == ref.size
    assert m["nan_ref"] == int(np.isnan(ref).sum()) and m["nan_test"] == int(np.isnan(test).sum())
    assert m["inf_ref"] == int(np.isinf(ref).sum()) and m["inf_test"] == int(np.isinf(test).sum())
    both = np.isfinite(ref) & np.isfinite(test)
    assert m["n_compared"] == int(both.sum())


@SETTINGS
@given(pair(any_f32))
def test_max_abs_is_the_float64_max_over_finite_positions(arrs):
    ref, test = arrs
    m = compare(ref, test)
    both = np.isfinite(ref) & np.isfinite(test)
    if not both.any():
        assert math.isnan(m["max_abs"])  # nothing to measure is NaN, never a fake 0
        return
    err = np.abs(test[both].astype(np.float64) - ref[both].astype(np.float64))
    assert m["max_abs"] == pytest.approx(float(err.max()), rel=1e-12, abs=0)
    assert m["mean_abs"] == pytest.approx(float(err.mean()), rel=1e-9, abs=1e-300)
    assert m["max_abs"] >= m["mean_abs"] >= 0


@SETTINGS
@given(hnp.arrays(np.float32, shapes, elements=any_f32))
def test_identical_tensors_always_pass_and_have_no_error(a):
    m, v = judge_arrays(a, a.copy(), Tolerance(atol=0.0, rtol=0.0))
    # NaN/Inf in the same place on both sides is not a mismatch
    assert m["nan_mismatch"] == 0 and m["inf_mismatch"] == 0
    if a.size == 0 or np.isfinite(a).any():
        assert a.size == 0 or m["max_abs"] == 0.0
        assert v.passed
    else:
        # no finite position at all: nothing can be measured, which is never reported as a pass
        assert not v.passed and "nothing to measure" in v.summary()


@SETTINGS
@given(pair(any_f32))
def test_nan_or_inf_appearing_in_the_test_only_always_fails(arrs):
    ref, test = arrs
    assume(np.isfinite(ref).all() and ref.size > 0)
    test = test.copy()
    test.reshape(-1)[0] = np.nan
    _, v = judge_arrays(ref, test, Tolerance(atol=1e30, rtol=1e30))
    assert not v.passed  # however loose the tolerance, a new NaN is a failure


@SETTINGS
@given(pair(finite_f32), st.floats(min_value=0, max_value=1e6), st.floats(min_value=0, max_value=1e6))
def test_verdict_is_monotonic_in_atol(arrs, a1, a2):
    ref, test = arrs
    lo, hi = sorted((a1, a2))
    _, v_lo = judge_arrays(ref, test, Tolerance(atol=lo, rtol=0.0))
    _, v_hi = judge_arrays(ref, test, Tolerance(atol=hi, rtol=0.0))
    assert (not v_lo.passed) or v_hi.passed  # passing at a tighter atol implies passing at a looser one
    assert v_hi.ratio <= v_lo.ratio or math.isclose(v_hi.ratio, v_lo.ratio) or math.isinf(v_lo.ratio)


@SETTINGS
@given(pair(finite_f32), st.floats(min_value=0, max_value=10), st.floats(min_value=0, max_value=10))
def test_verdict_is_monotonic_in_rtol_and_max_abs(arrs, r1, r2):
    ref, test = arrs
    lo, hi = sorted((r1, r2))
    _, v_lo = judge_arrays(ref, test, Tolerance(atol=0.0, rtol=lo))
    _, v_hi = judge_arrays(ref, test, Tolerance(atol=0.0, rtol=hi))
    assert (not v_lo.passed) or v_hi.passed
    _, m_lo = judge_arrays(ref, test, Tolerance(max_abs=lo))
    _, m_hi = judge_arrays(ref, test, Tolerance(max_abs=hi))
    assert (not m_lo.passed) or m_hi.passed


@SETTINGS
@given(pair(finite_f32), st.floats(min_value=0, max_value=1), st.floats(min_value=0, max_value=1))
def test_verdict_is_monotonic_in_min_cosine(arrs, c1, c2):
    ref, test = arrs
    lo, hi = sorted((c1, c2))
    _, v_strict = judge_arrays(ref, test, Tolerance(min_cosine=hi))
    _, v_loose = judge_arrays(ref, test, Tolerance(min_cosine=lo))
    assert (not v_strict.passed) or v_loose.passed


@SETTINGS
@given(pair(finite_f32), st.floats(min_value=0, max_value=1e3))
def test_allclose_matches_numpy_isclose(arrs, atol):
    ref, test = arrs
    assume(ref.size > 0)
    m, v = judge_arrays(ref, test, Tolerance(atol=atol, rtol=1e-3))
    r64, t64 = ref.astype(np.float64), test.astype(np.float64)
    expected_pass = bool(np.all(np.abs(t64 - r64) <= atol + 1e-3 * np.abs(r64)))
    assert v.passed == expected_pass


@SETTINGS
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5),
                  elements=st.floats(min_value=0.125, max_value=1024.0, width=32)),
       st.floats(min_value=1e-3, max_value=1e3))
def test_cosine_is_scale_invariant_and_within_bounds(a, scale):
    m = compare(a, (a.astype(np.float64) * scale).astype(np.float32))
    assert -1.0 - 1e-9 <= m["cosine"] <= 1.0 + 1e-9
    assert m["cosine"] == pytest.approx(1.0, abs=1e-5)


@SETTINGS
@given(st.sampled_from([(0,), (0, 3), (4, 0, 2)]))
def test_empty_tensors_pass_with_nothing_measured(shape):
    a = np.zeros(shape, np.float32)
    m, v = judge_arrays(a, a, Tolerance(atol=0.0, rtol=0.0, min_cosine=0.99))
    assert m["numel"] == 0 and m["n_compared"] == 0
    assert v.passed and v.skipped


@SETTINGS
@given(shapes, shapes)
def test_mismatched_shapes_raise_a_clear_error(s1, s2):
    a, b = np.zeros(s1, np.float32), np.zeros(s2, np.float32)
    squeezable = a.size == b.size and [d for d in s1 if d != 1] == [d for d in s2 if d != 1]
    if squeezable:
        m = compare(a, b)
        assert m["numel"] == a.size
    else:
        with pytest.raises(ValueError, match="shape mismatch"):
            compare(a, b)


@SETTINGS
@given(st.sampled_from([F32_MAX, -F32_MAX]), st.sampled_from([F32_MAX, -F32_MAX]))
def test_huge_values_give_inf_error_not_a_crash(x, y):
    ref = np.array([x, 1.0], np.float32)
    test = np.array([y, 1.0], np.float32)
    m, v = judge_arrays(ref, test, Tolerance(atol=1e-3, rtol=1e-3))
    err = abs(float(np.float64(y) - np.float64(x)))
    assert m["max_abs"] == pytest.approx(err)
    assert v.passed == (err == 0.0)


@SETTINGS
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=8),
                  elements=st.sampled_from([DENORMAL, -DENORMAL, 0.0, -0.0, 2 * DENORMAL])))
def test_denormals_and_signed_zeros_compare_exactly(a):
    m, v = judge_arrays(a, np.zeros_like(a), Tolerance(atol=1e-30, rtol=0.0))
    expected = float(np.abs(a.astype(np.float64)).max())
    assert m["max_abs"] == pytest.approx(expected, rel=1e-12, abs=0)
    assert v.passed  # a denormal is far inside any sane atol
    _, strict = judge_arrays(a, np.zeros_like(a), Tolerance(atol=0.0, rtol=0.0))
    assert strict.passed == (expected == 0.0)
