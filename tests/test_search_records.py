"""The bisect JSON users rely on (docs/bisect.md) from the typed records.

Real bisections of two sample models (a fusion culprit with its workaround; an
FP16 keep-set): every key the docs name is in the result, the records write
exactly the keys the results have always had, and reading the result back
into records writes it again unchanged.
"""

from __future__ import annotations

import json
import re

import pytest

from bisect_tui.core.bisect.records import RESULT_SCHEMA, BisectResult, Culprit, Step, Workaround
from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.core.tolerance import parse_tolerance
from bisect_tui.api import EngineConfig

from testlib import REPO, gelu_triage

# what docs/bisect.md promises, by where it sits in the result
DOCUMENTED = {
    "": ["verdict", "engine_builds", "steps", "culprits", "workaround", "layers", "precision", "parallel",
         "subgraph_builds", "rest_proven_by"],
    "culprit": ["fused_node", "op_type", "original_nodes", "optimizers", "attribution", "isolated",
                "worst_elements", "kind", "layer", "exposed_by", "amplified"],
    "attribution": ["group_test", "how"],
    "workaround": ["disabled_optimizers"],
    "step": ["worker", "subgraph"],
    "parallel": ["workers", "fanout", "pool"],
    "precision": ["keep_fp32", "builds", "passed", "metrics", "setting", "cli", "seeds", "tests"],
}
# the records' keys as every result before them had them (a run of the same models)
STEP_KEYS = {"n", "kind", "region", "enabled", "config", "marks", "passed", "ratio", "max_abs", "summary",
             "builds", "cached", "seconds", "fused_in_build", "key", "optimized", "error_kind", "error"}
CULPRIT_KEYS = {"kind", "layer", "exposed_by", "amplified", "fused_node", "op_type", "original_nodes",
                "optimizers", "interaction", "units", "attribution", "isolated", "worst_elements"}
WORKAROUND_KEYS = {"kind", "disabled_optimizers", "full_engine", "tried", "how"}
KEEPSET_KEYS = {"engine_pin", "candidates", "seeds", "keep_fp32", "passed", "tests", "metrics", "setting", "cli",
                "builds", "tests_run",
                "control", "instrument_failed", "minimality"}  # added by issue 21: the keep-everything control


@pytest.fixture(scope="module")
def results(samples, tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    gelu = gelu_triage(samples / "deep_stack.onnx", root / "gelu")
    fp16 = Triage(TriageOptions(model=samples / "fp16_keepset.onnx", session_dir=root / "fp16",
                                config=EngineConfig(precision="fp16"), tolerance=parse_tolerance("fp16")),
                  lambda p: None)
    fp16.run_all()
    return {"gelu": (gelu, run_bisection(gelu)), "fp16": (fp16, run_bisection(fp16))}


def test_every_key_the_docs_name_is_in_a_real_result(results):
    spans = re.findall(r"`([^`\n]+)`", (REPO / "docs" / "bisect.md").read_text())
    doc = {word for span in spans for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}
    gelu, fp16 = results["gelu"][1], results["fp16"][1]
    where = {"": gelu, "culprit": gelu["culprits"][0], "attribution": gelu["culprits"][0]["attribution"],
             "workaround": gelu["workaround"], "parallel": gelu["parallel"], "precision": fp16["precision"],
             "step": {k for st in gelu["steps"] for k in st}}
    for place, keys in DOCUMENTED.items():
        for key in keys:
            assert key in doc, f"{key} is not in docs/bisect.md"
            assert key in where[place], f"{place or 'bisect'}.{key} missing from the result"


def test_the_records_write_exactly_the_keys_results_have_always_had(results):
    gelu, fp16 = results["gelu"][1], results["fp16"][1]
    assert {k for st in gelu["steps"] for k in st} - {"worker", "subgraph", "round_size", "unblocked",
                                                      "elementwise_ratio"} == STEP_KEYS
    assert set(gelu["culprits"][0]) == CULPRIT_KEYS
    assert set(gelu["workaround"]) == WORKAROUND_KEYS
    assert set(fp16["precision"]) == KEEPSET_KEYS
    assert gelu["schema"] == fp16["schema"] == RESULT_SCHEMA


@pytest.mark.parametrize("case", ["gelu", "fp16"])
def test_a_result_read_back_into_records_is_written_again_unchanged(results, case):
    triage, res = results[case]
    on_disk = json.loads((triage.session.bisect_dir / "result.json").read_text())
    assert on_disk["schema"] == RESULT_SCHEMA and on_disk["verdict"] == res["verdict"]
    again = BisectResult.from_json(on_disk)
    assert again.to_json() == on_disk
    assert all(isinstance(s, Step) for s in again.steps) and all(isinstance(c, Culprit) for c in again.culprits)
    if case == "gelu":
        assert isinstance(again.workaround, Workaround) and again.workaround.disabled_passes
        assert again.culprits[0].original_nodes == res["culprits"][0]["original_nodes"]
    else:
        assert again.precision.keep_fp32 == res["precision"]["keep_fp32"] and again.precision.passed


def test_a_step_record_on_disk_is_the_steps_file_line(results):
    """steps.jsonl keeps its format: each line is the step's JSON, the time and its digest."""
    from bisect_tui.core.bisect.store import record_digest

    triage, res = results["gelu"]
    lines = [json.loads(x) for x in (triage.session.bisect_dir / "steps.jsonl").read_text().splitlines()]
    for rec in lines:
        assert rec["digest"] == record_digest(rec)
        assert set(rec) - {"at", "digest", "from"} == set(Step.from_json(rec).to_json())


@pytest.mark.parametrize("case", ["gelu", "fp16"])
def test_the_report_reads_the_result_record_as_it_reads_the_json(results, case):
    """The search side of the report takes the records (issue 20): a Summary
    holding the BisectResult renders the text and Markdown that report.json's
    dict does, and the steps keep the numbers the JSON gives them."""
    import dataclasses

    from bisect_tui.core.report import bisect_markdown, bisect_text
    from bisect_tui.core.report.search import steps_section
    from bisect_tui.core.triage.records import Summary

    triage, res = results[case]
    as_json = {**triage.summary(), "bisect": res}
    s = Summary.from_json(as_json)
    record = BisectResult.from_json(res)
    with_record = dataclasses.replace(s, extra={**s.extra, "bisect": record})
    assert bisect_text(with_record) == bisect_text(as_json)
    assert bisect_markdown(with_record) == bisect_markdown(as_json)
    assert [row[0] for row in steps_section(record).table.rows] == [st["n"] for st in res["steps"]]
