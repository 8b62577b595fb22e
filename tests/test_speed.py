"""The faster hot paths give the same numbers as the plain ones."""

from __future__ import annotations

import numpy as np
import pytest

from bisect_tui.core.stats import empty_stats, finish_stats, update_stats


def test_float32_stats_on_bits_match_the_float64_path():
    rng = np.random.default_rng(3)
    parts = [
        rng.standard_normal(5000) * 10.0 ** rng.integers(-12, 12, 5000),
        np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 65504.0, 65520.0, 2.0**-14, 2.0**-15, 2.0**-25,
                  2.0**-26, 1e-40, -1e-45, 3.3895313892515355e38, 3.4e38, 2.0**-134, 2.0**-135, 1.0, -1.0]),
        rng.standard_normal(100) * 1e-39,  # float32 subnormals
    ]
    a = np.concatenate(parts).astype(np.float32)
    fast = finish_stats(update_stats(empty_stats(), a))
    plain = finish_stats(update_stats(empty_stats(), a.astype(np.float64)))  # the frexp/float64 path
    assert fast["numel"] == plain["numel"] == a.size
    for k in ("finite", "nan", "inf", "zeros", "fp16_overflow", "fp16_subnormal", "fp16_underflow",
              "bf16_overflow", "bf16_underflow", "log2_hist", "min", "max", "abs_max", "mean", "std"):
        assert fast[k] == plain[k], k
    assert fast["nan"] == 1 and fast["inf"] == 2 and fast["zeros"] == 2
    assert sum(fast["log2_hist"]) == fast["finite"] - fast["zeros"]
    allnan = finish_stats(update_stats(empty_stats(), np.full(4, np.nan, np.float32)))
    assert allnan["finite"] == 0 and allnan["nan"] == 4 and allnan["min"] is None


def test_hand_written_to_dict_covers_every_field():
    """FusedNode and Unit serialise by hand (asdict was a hot spot): a field added
    later must not be silently dropped from the maps and results."""
    import dataclasses

    from bisect_tui.core.bisect.units import Unit
    from bisect_tui.api import FusedNode

    f = FusedNode("n", "FastGelu", "com.microsoft", ["a"], ["b"], ["x", "y"], ["GeluFusion"])
    assert f.to_dict() == {**dataclasses.asdict(f), "is_fused": True}
    assert FusedNode.from_dict(f.to_dict()) == f
    u = Unit(3, "n", "FastGelu", ["x", "y"], ["GeluFusion"], ["b"], ["t"], "com.microsoft", ["a"])
    assert u.to_dict() == dataclasses.asdict(u)
    assert Unit.from_dict(u.to_dict()) == u


def test_marked_build_returns_only_the_judged_outputs(samples):
    """A search step fetches the graph outputs only; the values are those of the full fetch."""
    import onnx

    from bisect_tui.core.graph import GraphIndex
    from bisect_tui.core.bisect.pool import BuildJob, build_and_run
    from bisect_tui.api import EngineConfig
    from bisect_tui.engines.ort.engine import OrtEngine

    path = samples / "transformer_block.onnx"
    model = onnx.load(str(path))
    outputs = [o.name for o in model.graph.output]
    marks = GraphIndex.build(model).intermediate_tensors()
    feeds = {i.name: np.random.default_rng(0).standard_normal(
        [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in model.graph.input}
    cfg = EngineConfig().to_dict()
    some = build_and_run(OrtEngine(), str(path), [feeds], BuildJob(cfg, tuple(marks), outputs=tuple(outputs)))
    every = build_and_run(OrtEngine(), str(path), [feeds], BuildJob(cfg, tuple(marks)))
    assert list(some.outputs[0]) == outputs
    assert len(every.outputs[0]) == len(set(outputs) | set(marks)) > len(outputs)
    for name in outputs:
        assert np.array_equal(some.outputs[0][name], every.outputs[0][name])


@pytest.mark.parametrize("packed", [False, True], ids=["one-file-per-tensor", "packed"])
def test_small_baseline_is_read_from_memory_and_reread_when_replaced(samples, tmp_path, monkeypatch, packed):
    """A small baseline goes into the read cache as it is dumped: load_tensor then
    opens no file, returns exactly the file's values, read-only; a file replaced
    on disk (new identity) is read again, never served stale. The same for a
    tensor inside a pack (baseline_pack.py)."""
    from bisect_tui.core import baseline as bl
    from bisect_tui.core import baseline_pack
    from bisect_tui.core.pipeline import Triage, TriageOptions

    if not packed:
        monkeypatch.setattr(baseline_pack, "PACK_MIN_TENSORS", 10 ** 9)
    t = Triage(TriageOptions(model=samples / "deep_stack.onnx", session_dir=tmp_path / "s",
                             check_determinism=False), lambda p: None)
    t.prepare()
    t.run_baseline()
    m = t.baseline.manifest
    names = [e["tensor"] for e in m["tensors"]]
    e = m["tensors"][3]
    assert ("member" in e) == packed
    opened = []
    real_load, real_open = np.load, bl.safepath.open_read
    monkeypatch.setattr(bl.np, "load", lambda *a, **k: opened.append(a[0]) or real_load(*a, **k))
    monkeypatch.setattr(bl.safepath, "open_read", lambda *a, **k: opened.append(a[1]) or real_open(*a, **k))
    arrays = {n: bl.load_tensor(t.session, m, n) for n in names}
    assert opened == []
    path = t.session.baseline_dir / e["file"]
    if packed:
        with real_load(path, allow_pickle=False) as z:  # numpy reads the member by its own name
            on_disk = z[e["member"][:-4]]
    else:
        on_disk = real_load(path, allow_pickle=False)
    assert np.array_equal(arrays[e["tensor"]], on_disk)
    assert not arrays[e["tensor"]].flags.writeable
    changed = np.asarray(arrays[e["tensor"]]) + 1
    tmp = path.with_name("x.tmp")
    if packed:  # the same pack with this member's values changed, as a new file
        data = bytearray(path.read_bytes())
        _, _, start, length = baseline_pack.member_at(bytes(data), e["offset"])
        data[start:start + length] = changed.tobytes()
        tmp.write_bytes(bytes(data))
    else:
        with open(tmp, "wb") as fh:
            np.save(fh, changed)
    tmp.replace(path)
    again = bl.load_tensor(t.session, m, e["tensor"])
    assert opened and np.array_equal(again, changed)
