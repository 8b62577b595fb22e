"""Verify sample_models/cases.json against real onnxruntime.

The sample models are built into a temporary folder by running
``sample_models/build.py --out DIR`` as a subprocess; then every claim in the
produced cases.json is checked:

* the model is valid ONNX (opset 17, ir_version 8, float32 static I/O, unique
  readable node names, < 2 MB);
* ``passes_with`` (and ``also_passes_with``) pass the case's tolerance preset;
* ``breaks_with`` breaks it, with the measured error well above the bound;
  ``lowest_breaking_level`` is the lowest level that breaks;
* ``expected_culprits`` equals what onnxruntime actually fused: the original
  nodes each fused node of ``culprit_op_type`` replaces, computed from the
  optimized model saved by ORT (mapping by tensor names);
* blocking every culprit (marking its tensors as graph outputs) makes the
  breaking engine pass again, so no culprit is missing, and for
  two_culprits each culprit alone still breaks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from testlib import old_ort_skip  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "sample_models" / "build.py"
MODELS = [
    "transformer_block.onnx",
    "cnn.onnx",
    "layernorm_fp16.onnx",
    "deep_stack.onnx",
    "two_culprits.onnx",
    "branchy.onnx",
    "passing_stack.onnx",
]
# Diagnosis classes (hidden culprit, FP16 keep-set, FP16 build error): their
# claims do not fit the one-fusion checks below; tests/test_diagnosis.py
# verifies each against plain onnxruntime.
DIAGNOSIS_MODELS = ["gelu_bias.onnx", "amplifying_stack.onnx", "conv_bn_fp16.onnx", "fp16_keepset.onnx",
                    "hann_fp16.onnx"]
LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
LEVEL_ORDER = list(LEVELS)
# The product's tolerance presets (duplicated on purpose: cases.json must agree).
PRESETS = {
    "fp32": {"atol": 1e-4, "rtol": 1e-4, "min_cosine": 0.99999},
    "fp16": {"atol": 1e-2, "rtol": 1e-2, "min_cosine": 0.999},
}
CLEAR_FAILURE = 3.0  # a breaking setting must exceed the bound by this factor


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("samples")
    proc = subprocess.run([sys.executable, str(BUILD), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "cases.json").read_text())
    return out, doc


@pytest.fixture(scope="module")
def cases(built):
    return {c["model"]: c for c in built[1]["cases"]}


class Case:
    """One cases.json entry plus cached model, inputs and baseline outputs."""

    def __init__(self, folder: Path, entry: dict):
        self.entry = entry
        self.path = folder / entry["model"]
        self.model = onnx.load(self.path)
        self.output_names = [o.name for o in self.model.graph.output]
        scale = entry.get("input_scale", 1.0)
        self.feeds = {
            name: (np.random.default_rng(0).standard_normal(shape) * scale).astype(np.float32)
            for name, shape in entry["input"].items()
        }
        self.tol = PRESETS[entry["preset"]]
        self.baseline = self.run({"level": "disable", "precision": "fp32", "config_entries": {}})

    def prepared(self, precision: str, mark: list[str] = ()) -> onnx.ModelProto:
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        if precision == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16
            m = convert_float_to_float16(m, keep_io_types=True)
        else:
            assert precision == "fp32", precision
        for t in mark:  # marking a tensor as output blocks every fusion that would swallow it
            m.graph.output.append(onnx.ValueInfoProto(name=t))
        return m

    def session(self, eng: dict, mark: list[str] = (), optimized_path: str | None = None):
        so = ort.SessionOptions()
        so.graph_optimization_level = LEVELS[eng["level"]]
        so.log_severity_level = 3
        for k, v in eng.get("config_entries", {}).items():
            so.add_session_config_entry(k, v)
        if optimized_path:
            so.optimized_model_filepath = optimized_path
        model = self.prepared(eng["precision"], mark)
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

    def run(self, eng: dict, mark: list[str] = ()) -> list[np.ndarray]:
        return self.session(eng, mark).run(self.output_names, self.feeds)

    def compare(self, outs: list[np.ndarray]) -> dict[str, dict]:
        """Per output: worst error/bound ratio, max abs error, cosine, fails."""
        res = {}
        for name, ref, out in zip(self.output_names, self.baseline, outs):
            ref = ref.astype(np.float64)
            out = out.astype(np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                err = np.abs(out - ref)
                bound = self.tol["atol"] + self.tol["rtol"] * np.abs(ref)
                ratio = np.where(np.isfinite(err), err / bound, np.inf)
                cos = float(np.dot(ref.ravel(), out.ravel())
                            / (np.linalg.norm(ref) * np.linalg.norm(out) + 1e-30))
            fails = bool(not np.all(err <= bound) or not cos >= self.tol["min_cosine"])
            res[name] = {"ratio": float(np.max(ratio)), "max_abs": float(np.nanmax(err)),
                         "cos": cos, "fails": fails}
        return res

    def check(self, eng: dict, mark: list[str] = ()) -> dict[str, dict]:
        return self.compare(self.run(eng, mark))

    def optimized(self, eng: dict, mark: list[str] = ()) -> tuple[onnx.ModelProto, onnx.ModelProto]:
        """(model given to ORT, ORT's optimized model)."""
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "optimized.onnx")
            self.session(eng, mark, optimized_path=p)
            return self.prepared(eng["precision"], mark), onnx.load(p)

    def tensors_of(self, node_names: list[str]) -> list[str]:
        return [o for n in self.model.graph.node if n.name in node_names for o in n.output]


def covered_originals(original: onnx.ModelProto, optimized: onnx.ModelProto, op_type: str) -> list[set[str]]:
    """For each optimized-graph node of op_type, the original nodes it replaces.

    A fused node keeps the output tensor names of the last original node and
    takes the pattern's external inputs, so walk back from its outputs through
    the original graph, stopping at tensors that still exist in the optimized
    graph (or at initializers / graph inputs)."""
    producer = {o: n for n in original.graph.node for o in n.output}
    surviving = {t for n in optimized.graph.node for t in (*n.input, *n.output)}
    surviving |= {o.name for o in optimized.graph.output}
    result = []
    for node in optimized.graph.node:
        if node.op_type != op_type:
            continue
        covered: set[str] = set()
        stack = [producer[o] for o in node.output if o in producer]
        assert stack, f"fused node {node.name} keeps no original output tensor name"
        while stack:
            p = stack.pop()
            if p.name in covered:
                continue
            covered.add(p.name)
            stack.extend(producer[i] for i in p.input if i in producer and i not in surviving)
        result.append(covered)
    return result


@pytest.fixture(scope="module")
def case_cache(built):
    cache = {}

    def get(model: str) -> Case:
        if model not in cache:
            entry = next(c for c in built[1]["cases"] if c["model"] == model)
            cache[model] = Case(built[0], entry)
        return cache[model]

    return get


def _original_names(case: Case) -> set[str]:
    return {n.name for n in case.model.graph.node}


# --------------------------------------------------------------------------
# the script and cases.json
# --------------------------------------------------------------------------


def test_build_writes_all_models_and_is_idempotent(built):
    out, doc = built
    assert [c["model"] for c in doc["cases"]] == MODELS + DIAGNOSIS_MODELS
    assert doc["tolerances"] == PRESETS
    assert doc["baseline"] == {"level": "disable", "precision": "fp32", "config_entries": {}}
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = subprocess.run([sys.executable, str(BUILD), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "wrote" not in proc.stdout, proc.stdout  # everything identical -> skipped
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_cases_schema(cases):
    engine_keys = {"level", "precision", "config_entries"}
    for name, c in cases.items():
        if name in DIAGNOSIS_MODELS:
            assert c["class"] in ("hidden_culprit", "amplifying", "untagged_pass", "precision", "build_error"), name
            continue
        assert c["preset"] in PRESETS, name
        assert isinstance(c["description"], str) and c["description"], name
        for eng in [c["passes_with"], *c.get("also_passes_with", [])]:
            assert set(eng) == engine_keys, name
        if c["breaks_with"] is None:
            assert c["expected_culprits"] == [], name
        else:
            assert set(c["breaks_with"]) == engine_keys, name
            assert c["expected_culprits"], name
            assert c["lowest_breaking_level"] in LEVEL_ORDER, name
            assert c["culprit_op_type"], name


# --------------------------------------------------------------------------
# per model
# --------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_model_is_well_formed(case_cache, model):
    case = case_cache(model)
    m = case.model
    onnx.checker.check_model(m, full_check=True)
    assert m.ir_version == 8
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 17)]
    assert case.path.stat().st_size < 2 * 1024 * 1024
    names = [n.name for n in m.graph.node]
    assert all(names) and len(set(names)) == len(names)
    for vi in [*m.graph.input, *m.graph.output]:
        tt = vi.type.tensor_type
        assert tt.elem_type == onnx.TensorProto.FLOAT, vi.name
        assert all(d.HasField("dim_value") and d.dim_value > 0 for d in tt.shape.dim), vi.name
    assert {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input} \
        == case.entry["input"]
    for culprit in case.entry["expected_culprits"]:
        assert culprit and set(culprit) <= set(names), culprit


@pytest.mark.parametrize("model", MODELS)
def test_passes_with(case_cache, model):
    case = case_cache(model)
    for eng in [case.entry["passes_with"], *case.entry.get("also_passes_with", [])]:
        res = case.check(eng)
        assert not any(r["fails"] for r in res.values()), (eng, res)


BREAKING = [m for m in MODELS if m not in ("cnn.onnx", "passing_stack.onnx")]


@pytest.mark.parametrize("model", MODELS)
@old_ort_skip
def test_breaks_with(case_cache, model):
    case = case_cache(model)
    eng = case.entry["breaks_with"]
    if eng is None:
        assert model not in BREAKING
        return
    res = case.check(eng)
    broken = case.entry.get("broken_outputs", case.output_names)
    for name, r in res.items():
        if name in broken:
            # measured max abs error exceeds the tolerance bound, clearly
            assert r["fails"] and r["ratio"] > CLEAR_FAILURE, (name, r)
        else:
            assert not r["fails"], (name, r)
    # lowest_breaking_level: that level breaks, the one below does not
    lowest = case.entry["lowest_breaking_level"]
    assert any(r["fails"] for r in case.check({**eng, "level": lowest}).values())
    below = LEVEL_ORDER[LEVEL_ORDER.index(lowest) - 1]
    assert not any(r["fails"] for r in case.check({**eng, "level": below}).values())


@pytest.mark.parametrize("model", BREAKING)
@old_ort_skip
def test_expected_culprits_match_ort_fusion(case_cache, model):
    """Compute the culprit node sets from ORT's saved optimized model."""
    case = case_cache(model)
    eng = case.entry["breaks_with"]
    given, optimized = case.optimized(eng)
    found = covered_originals(given, optimized, case.entry["culprit_op_type"])
    originals = _original_names(case)
    # after fp16 conversion the graph also holds inserted Cast nodes; keep original names
    found = {frozenset(s & originals) for s in found}
    expected = {frozenset(c) for c in case.entry["expected_culprits"]}
    assert found == expected


@pytest.mark.parametrize("model", BREAKING)
@old_ort_skip
def test_blocking_all_culprits_restores_tolerance(case_cache, model):
    """No culprit is missing: with every expected culprit's tensors marked as
    outputs (fusion blocked), the breaking engine passes."""
    case = case_cache(model)
    eng = case.entry["breaks_with"]
    mark = case.tensors_of([n for c in case.entry["expected_culprits"] for n in c])
    _, optimized = case.optimized(eng, mark)
    assert not [n for n in optimized.graph.node if n.op_type == case.entry["culprit_op_type"]]
    res = case.check(eng, mark)
    assert not any(r["fails"] for r in res.values()), res


@old_ort_skip
def test_each_culprit_alone_breaks(case_cache):
    case = case_cache("two_culprits.onnx")
    assert case.entry["each_culprit_alone_breaks"] is True
    culprits = case.entry["expected_culprits"]
    assert len(culprits) == 2
    eng = case.entry["breaks_with"]
    for k, culprit in enumerate(culprits):
        others = [n for j, c in enumerate(culprits) if j != k for n in c]
        mark = case.tensors_of(others)
        given, optimized = case.optimized(eng, mark)
        found = covered_originals(given, optimized, case.entry["culprit_op_type"])
        assert found == [set(culprit)]  # the other one really is blocked
        res = case.check(eng, mark)
        r = res[case.output_names[0]]
        assert r["fails"] and r["ratio"] > CLEAR_FAILURE, (culprit, r)


def test_structural_claims(case_cache):
    """What the brief promises about where the culprits sit."""
    gelu_parts = ["div", "erf", "add_one", "mul_x", "mul_half"]

    def gelu(prefix):
        return [f"{prefix}/gelu/{p}" for p in gelu_parts]

    assert case_cache("transformer_block.onnx").entry["expected_culprits"] == [gelu("mlp")]
    assert case_cache("branchy.onnx").entry["expected_culprits"] == [gelu("mlp")]
    assert case_cache("deep_stack.onnx").entry["expected_culprits"] == [gelu("blk11")]
    assert case_cache("two_culprits.onnx").entry["expected_culprits"] == [gelu("blk2"), gelu("blk9")]
    for model, n_blocks in [("deep_stack.onnx", 16), ("two_culprits.onnx", 12), ("passing_stack.onnx", 12)]:
        ops = {n.name: n.op_type for n in case_cache(model).model.graph.node}
        gelu_blocks = {int(name.split("/")[0][3:]) for name, op in ops.items() if op == "Erf"}
        relu_blocks = {int(name.split("/")[0][3:]) for name, op in ops.items() if op == "Relu"}
        assert gelu_blocks | relu_blocks == set(range(n_blocks)) and not gelu_blocks & relu_blocks
        expected = {"deep_stack.onnx": {11}, "two_culprits.onnx": {2, 9}, "passing_stack.onnx": set()}
        assert gelu_blocks == expected[model]
    branchy = case_cache("branchy.onnx")
    assert len(branchy.output_names) == 2
    assert branchy.entry["broken_outputs"] == [branchy.output_names[0]]
