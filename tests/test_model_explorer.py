"""Node data for Google's Model Explorer from a finished bisection: the JSON has the
structure the package documents (model_explorer/node_data_builder.py: GraphNodeData
with `results` of NodeDataResult, `thresholds` of ThresholdItem), its keys are tensors
of the model, its values are the session's measurements, and the culprit stands out."""

from __future__ import annotations

import json
import numbers

import onnx
import pytest

from bisect_tui.cli import main
from bisect_tui.core.report.model_explorer import CULPRIT_BG, node_data, write_model_explorer

GELU = ["--ort-config", "optimization.enable_gelu_approximation=1"]
GRAPH_NODE_DATA = {"results", "name", "thresholds", "gradient", "hideInAggregatedStatsTable",
                   "hideInChildrenStatsTable", "hideAggregatedStats", "showExpandedSummaryOnGroupNode",
                   "showLabelCountColumnsInChildrenStatsTable"}
CSS_COLOR_KEYS = {"bgColor", "textColor"}


def validate_graph_node_data(d: dict) -> None:
    """The documented structure, field by field (a number is an int or a float, never a bool)."""
    assert isinstance(d, dict) and set(d) <= GRAPH_NODE_DATA and "results" in d
    # the web app reads a file as one graph's data when `results` has no `results` of its own
    assert isinstance(d["results"], dict) and "results" not in d["results"]
    assert isinstance(d.get("name", ""), str)
    for key, r in d["results"].items():
        assert isinstance(key, str) and key
        assert set(r) <= {"value"} | CSS_COLOR_KEYS and "value" in r
        assert isinstance(r["value"], numbers.Real) and not isinstance(r["value"], bool)
        assert all(isinstance(r[k], str) for k in CSS_COLOR_KEYS & set(r))
    values = []
    for t in d.get("thresholds", []):
        assert set(t) <= {"value", "bgColor", "textColor"} and isinstance(t["bgColor"], str)
        assert isinstance(t["value"], numbers.Real)
        values.append(t["value"])
    assert values == sorted(values)


@pytest.fixture
def finished(samples, tmp_path, capsys):
    sess = tmp_path / "s"
    code = main(["bisect", str(samples / "transformer_block.onnx"), "--session", str(sess), *GELU, "-q"])
    capsys.readouterr()
    assert code == 1
    return sess


def test_node_data_of_a_bisection(finished):
    path = write_model_explorer(finished)
    assert path == finished / "model-explorer.json"
    d = json.loads(path.read_text())
    validate_graph_node_data(d)
    s = json.loads((finished / "report.json").read_text())
    assert "atol=0.0001 rtol=0.0001" in d["name"]  # the tolerance the values are measured against
    # every key is a tensor some node of the model makes: Model Explorer matches it to that node
    model = onnx.load(str(finished / "model.onnx"))
    made = {t for n in model.graph.node for t in n.output}
    assert set(d["results"]) <= made
    # the values are the session's: each exposed tensor's error / tolerance, each output's worst element
    for p in s["shared_tensors"]["profile"]:
        if p["tensor"] not in s["outputs"]:
            assert d["results"][p["tensor"]]["value"] == pytest.approx(p["ratio"])
    out = s["outputs"]["mlp/residual:0"]["metrics"]["allclose_max_ratio"]
    assert d["results"]["mlp/residual:0"]["value"] == pytest.approx(out) and out > 1
    # the culprit's region (FastGelu: five original nodes) is highlighted, nothing else
    red = {k for k, r in d["results"].items() if r.get("bgColor") == CULPRIT_BG}
    assert red == {f"mlp/gelu/{n}:0" for n in ("div", "erf", "add_one", "mul_x", "mul_half")}
    first = s["shared_tensors"]["first_failing_tensor"]
    assert first in red and d["results"][first]["value"] > 1
    assert all(d["results"][t]["value"] == d["results"][first]["value"] for t in red)  # the fused node's
    below = [k for k, r in d["results"].items() if k not in red]
    assert below and all("bgColor" not in d["results"][k] for k in below)  # coloured by the thresholds
    assert d["thresholds"][0]["value"] == 1  # within the tolerance: the first range


def test_a_passing_check_has_no_culprit(samples, tmp_path, capsys):
    sess = tmp_path / "s"
    assert main(["check", str(samples / "transformer_block.onnx"), "--session", str(sess), "-q"]) == 0
    capsys.readouterr()
    d = node_data(json.loads((sess / "report.json").read_text()))
    validate_graph_node_data(d)
    assert d["results"] and all("bgColor" not in r for r in d["results"].values())
    assert all(r["value"] <= 1 for r in d["results"].values())


def test_the_package_loads_it(finished):
    """With ai-edge-model-explorer installed: its own dataclasses take the file, strictly."""
    ndb = pytest.importorskip("model_explorer.node_data_builder")
    dacite = pytest.importorskip("dacite")
    d = json.loads(write_model_explorer(finished).read_text())
    g = dacite.from_dict(ndb.GraphNodeData, d, config=dacite.Config(strict=True))
    assert {k: v for k, v in json.loads(g.to_json_string()).items() if k in d} == d


def test_check_and_bisect_write_it_on_request(samples, tmp_path):
    """`--model-explorer FILE` on the command line: the same node data, where asked."""
    import json

    from bisect_tui.cli import main

    out = tmp_path / "me.json"
    code = main(["bisect", str(samples / "transformer_block.onnx"), "--session", str(tmp_path / "s"), "-q",
                 "--ort-config", "optimization.enable_gelu_approximation=1", "--model-explorer", str(out)])
    assert code == 1
    data = json.loads(out.read_text())
    assert data["name"].startswith("bisect-tui") and data["results"] and data["thresholds"]
    # the file is ours now: a second run may replace it; a stranger's file of that name is refused
    assert main(["check", str(samples / "transformer_block.onnx"), "--session", str(tmp_path / "s"), "-q",
                 "--model-explorer", str(out)]) == 0
    (tmp_path / "mine.json").write_text('{"name": "my graph", "results": {}}')
    assert main(["check", str(samples / "transformer_block.onnx"), "--session", str(tmp_path / "s"), "-q",
                 "--model-explorer", str(tmp_path / "mine.json")]) == 2
    assert json.loads((tmp_path / "mine.json").read_text())["name"] == "my graph"
