"""The baseline's `.npy` writer: files numpy reads back bit for bit, digests of
the data written, statistics equal to the plain path, and failures that leave
no temp file behind."""

from __future__ import annotations

import hashlib
import io
import math
import resource
import signal

import numpy as np
import pytest

from bisect_tui.core.baseline_manifest import npy_data_sha256
from bisect_tui.core.baseline_writer import PARALLEL_BYTES, NpySink
from bisect_tui.core.stats import F32_SLICE, PAIRS_FROM, Scratch, empty_stats, finish_stats, update_stats

COUNTS = ("numel", "finite", "nan", "inf", "zeros", "fp16_overflow", "fp16_subnormal", "fp16_underflow",
          "bf16_overflow", "bf16_underflow", "log2_hist", "min", "max", "abs_max")


def _arrays() -> dict[str, list[np.ndarray]]:
    """Two samples of each kind the writer may be handed."""
    rng = np.random.default_rng(11)
    big = rng.standard_normal((2, 3, 1 << 17)).astype(np.float32)  # 3 MiB per sample: the threaded path
    assert big[0].nbytes >= PARALLEL_BYTES
    out = {
        "big_f32": [big[0], big[1] * 1e3],
        "f32": [rng.standard_normal((4, 5)).astype(np.float32) for _ in range(2)],
        "f16": [rng.standard_normal((3, 7)).astype(np.float16) for _ in range(2)],
        "f64": [rng.standard_normal(9) for _ in range(2)],
        "bool": [rng.random((2, 3)) > 0.5 for _ in range(2)],
        "i64": [rng.integers(-(1 << 62), 1 << 62, (5,)) for _ in range(2)],
        "u8": [rng.integers(0, 255, (4, 4), dtype=np.uint8) for _ in range(2)],
        "scalar": [np.array(1.5, np.float32), np.array(-2.0, np.float32)],
        "empty": [np.zeros((0, 3), np.float32) for _ in range(2)],
        # not C-contiguous: a transposed view and a strided slice
        "transposed": [rng.standard_normal((6, 4)).astype(np.float32).T for _ in range(2)],
        "strided_big": [rng.standard_normal((2, 1 << 19)).astype(np.float32)[:, ::2] for _ in range(2)],
    }
    try:
        import ml_dtypes

        out["bf16"] = [rng.standard_normal(6).astype(ml_dtypes.bfloat16) for _ in range(2)]
    except ImportError:
        pass
    return out


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def test_written_files_equal_numpy_save_with_their_digests_and_stats(tmp_path):
    arrays = _arrays()
    names = {t: f"{t}.npy" for t in arrays}
    done: dict[str, dict] = {}
    sink = NpySink(tmp_path, names, 2, lambda t, meta: done.__setitem__(t, meta))
    used_threads = False
    try:
        for k in range(2):
            for t, samples in arrays.items():
                sink.write(t, k, samples[k])
        used_threads = sink._pool is not None
        for t in arrays:
            sink.end(t)
    finally:
        sink.abort()
    assert used_threads  # the large arrays went through the write/hash/statistics threads
    assert sink._pool is None and not list(tmp_path.glob(".tmp_*"))
    for t, samples in arrays.items():
        path = tmp_path / names[t]
        stacked = np.stack([np.asarray(s) for s in samples])
        # byte for byte what numpy.save writes for the stacked samples, header included
        assert path.read_bytes() == _npy_bytes(stacked), t
        meta = done[t]
        assert meta["shape"] == list(samples[0].shape) and meta["bytes"] == stacked.nbytes
        assert meta["dtype"] == stacked.dtype.name
        data = stacked.reshape(-1).view(np.uint8).tobytes()
        assert meta["sha256"] == hashlib.sha256(data).hexdigest() == npy_data_sha256(path)[0], t
        if stacked.dtype.kind != "V":  # numpy itself reads ml_dtypes' bfloat16 back as raw V2
            back = np.load(path, allow_pickle=False)
            assert back.dtype == stacked.dtype and back.shape == stacked.shape
            assert back.tobytes() == stacked.tobytes(), t  # bit-identical, NaN payloads and -0.0 too
        plain = empty_stats()
        for s in samples:
            update_stats(plain, np.ascontiguousarray(s))
        assert meta["stats"] == finish_stats(plain), t


def test_failed_write_raises_and_leaves_no_temp_file(tmp_path):
    """A file-size limit makes the kernel refuse the write (EFBIG), as a full disk
    would: the error comes out of the writer thread and abort removes the file."""
    big = np.ones(1 << 20, np.float32)  # 4 MiB, the threaded path
    sink = NpySink(tmp_path, {"t": "t.npy"}, 1, lambda *_: None)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        with pytest.raises(OSError) as exc:
            sink.write("t", 0, big)
        assert "File too large" in str(exc.value)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
        sink.abort()
    assert list(tmp_path.iterdir()) == []


def test_sample_changing_type_is_refused(tmp_path):
    sink = NpySink(tmp_path, {"t": "t.npy"}, 2, lambda *_: None)
    try:
        sink.write("t", 0, np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="changed shape or type"):
            sink.write("t", 1, np.zeros(3, np.float64))
    finally:
        sink.abort()
    assert list(tmp_path.iterdir()) == []


def _edge_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 values on both sides of every threshold, in every exponent field."""
    f16max = np.float32(65504.0)
    bf16max = np.float32(3.3895313892515355e38)
    special = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, f16max, np.nextafter(f16max, np.inf),
                        65520.0, 40000.0, -40000.0, bf16max, np.nextafter(bf16max, np.inf),
                        np.nextafter(bf16max, 0), 2.0**-14, np.nextafter(np.float32(2.0**-14), 0), 2.0**-25,
                        np.nextafter(np.float32(2.0**-25), 0), 2.0**-134, np.nextafter(np.float32(2.0**-134), 0),
                        1e-45, -1e-40, 2.0**-126, 2.0**31, 2.0**33, 2.0**-33], np.float32)
    wide = (rng.standard_normal(n) * 10.0 ** rng.integers(-46, 39, n)).astype(np.float32)
    return np.where(rng.random(n) < 0.05, rng.choice(special, n), wide).astype(np.float32)


@pytest.mark.parametrize("n", [1, 2, 3, 1001, PAIRS_FROM - 1, PAIRS_FROM + 1, F32_SLICE - 1, F32_SLICE + 3,
                               2 * F32_SLICE + 7])
def test_float32_counts_on_exponent_fields_match_the_float64_path(n):
    """The float32 statistics count exponent fields two at a time and skip the
    passes no field calls for; the float64 path compares every value. Counts,
    extremes and histogram are equal; mean and std are sums in float64 added up
    per slice (the float64 path per chunk), equal to rounding."""
    rng = np.random.default_rng(n)
    with np.errstate(over="ignore"):
        samples = [_edge_values(rng, n), rng.standard_normal(n).astype(np.float32),
                   # FP16 overflow with and without values in the field of 65504 itself
                   np.where(rng.random(n) < 0.5, 40000.0, 70000.0).astype(np.float32),
                   np.where(rng.random(n) < 0.5, 1.0, 70000.0).astype(np.float32)]
    fast, plain, reused = empty_stats(), empty_stats(), empty_stats()
    scratch = Scratch()
    for s in samples:
        update_stats(fast, s)
        update_stats(reused, s, scratch)  # one scratch for every sample, as the dump does
        update_stats(plain, s.astype(np.float64))
    fast, plain, reused = finish_stats(fast), finish_stats(plain), finish_stats(reused)
    assert fast == reused
    for k in COUNTS:
        assert fast[k] == plain[k], k
    assert math.isclose(fast["mean"], plain["mean"], rel_tol=1e-12, abs_tol=1e-300)
    assert math.isclose(fast["std"], plain["std"], rel_tol=1e-9)
    # the independent numbers: what numpy says directly
    a = np.concatenate(samples).astype(np.float64)
    fin = a[np.isfinite(a)]
    assert fast["nan"] == int(np.isnan(a).sum()) and fast["inf"] == int(np.isinf(a).sum())
    assert fast["fp16_overflow"] == int((np.abs(fin) > 65504.0).sum())
    assert fast["bf16_overflow"] == int((np.abs(fin) > 3.3895313892515355e38).sum())
    assert fast["bf16_underflow"] == int(((fin != 0) & (np.abs(fin) < 2.0**-134)).sum())
    assert fast["abs_max"] == float(np.abs(fin).max())
    assert sum(fast["log2_hist"]) == fast["finite"] - fast["zeros"]


def test_float32_all_non_finite_and_negative_zero():
    st = finish_stats(update_stats(empty_stats(), np.array([np.nan, np.inf, -np.inf], np.float32)))
    assert (st["finite"], st["nan"], st["inf"], st["min"], st["mean"]) == (0, 1, 2, None, None)
    z = finish_stats(update_stats(empty_stats(), np.full(5, -0.0, np.float32)))
    assert (z["zeros"], z["abs_max"], z["fp16_subnormal"], z["bf16_underflow"]) == (5, 0.0, 0, 0)
    assert math.copysign(1.0, z["abs_max"]) == 1.0
