"""Work the checklist and the search no longer repeat (issue 24, eighth pass), each
on the real libraries: the prepared model handed to the parted builds instead of
read again, the whole model kept in the map's cache while subgraphs are mapped,
the float64 truth's check comparing tensors in batches with the same numbers,
and the engine under test's map read beside the probe."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest

from bisect_tui.api import EngineConfig
from bisect_tui.core.bisect import parts
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.core.reference_check import rel_diff, rel_diffs
from bisect_tui.engines.ort import fusedmap
from bisect_tui.engines.ort import session as ort_session

from testlib import REPO

sys.path.insert(0, str(REPO / "bench"))
from scale_models import two_culprit_stack  # noqa: E402


def _pairs() -> list:
    """Every kind of pair the check meets: equal shapes in several dtypes, NaN and
    infinity on either side, all zeros of either sign, a shape to reshape, 0-d,
    empty, a large tensor, and values that are not arrays."""
    rng = np.random.default_rng(7)
    out = []
    for k in range(700):
        shape = [(16, 16), (1, 16, 16), (3,), (7, 5), (), (0,), (2, 2)][k % 7]
        x = rng.standard_normal(shape)
        y = (x + rng.standard_normal(shape) * 1e-6).astype(np.float32 if k % 3 else np.float64)
        if k % 11 == 0 and x.size:
            x.flat[0] = np.nan
        if k % 13 == 0 and x.size:
            y.flat[-1] = np.inf
        if k % 23 == 0 and x.size:
            x.flat[-1] = -np.inf
            y.flat[-1] = -np.inf
        if k % 17 == 0:
            x, y = -np.zeros(shape), np.zeros(shape, np.float32)
        if k % 29 == 0:
            x, y = np.zeros(shape), -np.zeros(shape, np.float32)
        if k % 19 == 0 and x.size:
            x = x.reshape(-1)
        out.append((x, y))
    big = rng.standard_normal(1 << 17)
    out.append((big, big.astype(np.float32)))
    out.append((np.float64(1.5), np.float32(1.25)))
    return out


def _same(a: tuple, b: tuple) -> bool:
    """Equal floats, NaN equal to NaN, and zeros of the same sign."""
    return all((u != u and v != v) or (u == v and np.copysign(1, u) == np.copysign(1, v)) for u, v in zip(a, b))


def test_batched_comparison_gives_each_pair_the_numbers_and_warnings_of_one_by_one():
    import warnings

    pairs = _pairs()
    with warnings.catch_warnings(record=True) as alone:
        warnings.simplefilter("always")
        one = [rel_diff(x, y) for x, y in pairs]
    with warnings.catch_warnings(record=True) as together:
        warnings.simplefilter("always")
        batched = rel_diffs(pairs)
    # numpy's warnings are the float64 truth's record: the same ones, as often
    assert [str(w.message) for w in together] == [str(w.message) for w in alone] and alone
    assert len(batched) == len(one)
    bad = [(i, u, v) for i, (u, v) in enumerate(zip(one, batched)) if not _same(u, v)]
    assert not bad, bad[:5]
    # the cases that must take the one-by-one path are there and give what it gives
    assert any(r[0] == float("inf") for r in one) and any(r == (0.0, 0.0, 0.0) for r in one)


def test_the_whole_model_outlives_the_subgraphs_mapped_after_it(tmp_path):
    model, _ = two_culprit_stack(4, 12)
    whole = tmp_path / "whole.onnx"
    onnx.save(model, whole)
    ort_session._MAP_ORIGINAL.clear()
    fusedmap._ORIGINAL.clear()
    first = ort_session._original_for_map(whole)
    for k in range(ort_session._MAP_ORIGINAL_KEPT + 2):  # more small models than the cache holds
        small = onnx.helper.make_model(onnx.helper.make_graph(
            [onnx.helper.make_node("Relu", ["a"], [f"b{k}"], name=f"r{k}")], f"g{k}",
            [onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info(f"b{k}", onnx.TensorProto.FLOAT, [1])]))
        onnx.save(small, tmp_path / f"small{k}.onnx")
        ort_session._original_for_map(tmp_path / f"small{k}.onnx")
        fusedmap._original_index(ort_session._original_for_map(tmp_path / f"small{k}.onnx"))
        if k == 0:
            entry = fusedmap._original_index(first)
    assert len(ort_session._MAP_ORIGINAL) == ort_session._MAP_ORIGINAL_KEPT
    assert ort_session._original_for_map(whole) is first  # not read again
    assert fusedmap._original_index(first) is entry  # nor indexed again
    ort_session._MAP_ORIGINAL.clear()
    fusedmap._ORIGINAL.clear()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    d = tmp_path_factory.mktemp("savings")
    model, _ = two_culprit_stack(20, 12)  # 300 nodes
    path = d / "ln0_300.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(0).standard_normal((1, 16, 16)).astype(np.float32)
    np.savez(d / "x.npz", x=x)
    return path, d / "x.npz"


def test_the_parted_builds_start_from_the_prepared_model_not_a_second_read(stack, tmp_path, monkeypatch):
    path, x = stack
    monkeypatch.setattr(parts, "PART_NODES", 60)
    t = Triage(TriageOptions(model=path, session_dir=tmp_path / "s", config=EngineConfig(), input_file=x))
    t.prepare()
    model, index, at = parts._loaded(str(t.session.model_path))
    assert model is t.info.model and index is t.info.index  # not read from the file again
    # the positions name every initializer, in the model's order
    assert [model.graph.initializer[k[0]].name for k in at.values()] == [i.name for i in model.graph.initializer]
    t.search_ahead = True  # as the bisect command sets it: the blocked build starts after the dump
    t.run_all()
    assert t.fused["passed"] is False
    blocked = t.search_builds  # the blocked build, in parts, from the same objects
    assert blocked and all(len(f.result()) == 1 and f.result()[0].parts >= 4 for f in blocked.values())
    key = parts._file_key(str(t.session.model_path))
    assert parts._LOADED[key][0] is model  # nor by the parted build


def test_the_check_reads_the_map_beside_the_probe_and_keeps_the_same_record(stack, tmp_path):
    import threading

    from bisect_tui.engines.ort.session import OrtBuilt

    path, x = stack
    seen = []
    real = OrtBuilt.fused_nodes.fget

    def mapped(self):
        seen.append(threading.current_thread().name)
        return real(self)

    OrtBuilt.fused_nodes = property(mapped)
    try:
        t = Triage(TriageOptions(model=path, session_dir=tmp_path / "s", config=EngineConfig(), input_file=x))
        t.run_all()
    finally:
        OrtBuilt.fused_nodes = property(real)
    assert seen and seen[0].startswith("fused-map")
    fused = t.fused
    assert fused["passed"] is False and fused["fused_nodes"]
    saved = t.session.read_json(f"engines/ort-{EngineConfig().key()}/fused_nodes.json")
    assert [n for n in saved if n["is_fused"]] == list(fused["fused_nodes"])
    assert t.fused_map_objs[2] and [n.to_dict() for n in t.fused_map_objs[2]] == saved
