"""The top-level keys of `check --json` are a contract (docs/check.md): a real
check's JSON has exactly the documented keys, and the typed records read and
write check.json and the summary without losing or adding one."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bisect_tui.cli import main
from bisect_tui.core.pipeline import SCHEMA_VERSION, CheckResult, Summary
from bisect_tui.core.triage.records import ArbiterResult, DeterminismResult, RangeCheck
from bisect_tui.core.triage.records import SUMMARY_KEYS

from testlib import REPO

GELU = ["--ort-config", "optimization.enable_gelu_approximation=1"]


def documented_keys() -> set[str]:
    """The backticked names of the "Top-level keys" paragraph, outside its parentheses."""
    text = (REPO / "docs" / "check.md").read_text(encoding="utf-8")
    para = text.split("Top-level keys:", 1)[1].split("\n\n", 1)[0]
    while True:  # nested parentheses: innermost first
        flat = re.sub(r"\([^()]*\)", "", para)
        if flat == para:
            break
        para = flat
    return set(re.findall(r"`([a-z_]+)`", para))


def check_json(samples: Path, tmp_path: Path, *flags: str) -> tuple[int, dict]:
    out = tmp_path / f"check{len(flags)}.json"
    code = main(["check", str(samples / "transformer_block.onnx"), "--session", str(tmp_path / "s"),
                 "--json", str(out), "-q", *flags])
    return code, json.loads(out.read_text())


def test_check_json_has_exactly_the_documented_keys(samples, tmp_path):
    code, ok = check_json(samples, tmp_path)
    assert code == 0 and ok["verdict"] == "pass"
    assert list(ok) == list(SUMMARY_KEYS)  # the order too: the records write today's layout
    assert set(ok) == documented_keys() - {"precision_used"}  # that one only when asked != used
    assert ok["schema_version"] == SCHEMA_VERSION == 1
    code, bad = check_json(samples, tmp_path, *GELU)
    assert code == 1 and bad["verdict"] == "fail" and list(bad) == list(SUMMARY_KEYS)
    assert bad["failing_outputs"] and bad["engine_error"] is None


def test_records_round_trip_check_json_and_the_summary(samples, tmp_path):
    code, summary = check_json(samples, tmp_path, *GELU)
    assert code == 1
    saved = json.loads((tmp_path / "s" / "check.json").read_text())
    check = CheckResult.from_json(saved)
    assert check.to_json() == saved and list(check.to_json()) == list(saved)
    assert not check.passed and check.failing_outputs == tuple(summary["failing_outputs"])
    (name, verdict), = check.outputs.items()
    assert verdict.verdict["failed"] == summary["outputs"][name]["verdict"]["failed"]
    assert 1e-3 < verdict.metrics["max_abs"] < 1e-2
    again = Summary.from_json(summary, check).to_json()
    assert again == summary and list(again) == list(summary)
    for file, record in (("determinism.json", DeterminismResult), ("range_check.json", RangeCheck),
                         ("arbiter.json", ArbiterResult)):
        saved = json.loads((tmp_path / "s" / file).read_text())
        assert record.from_json(saved).to_json() == saved, file
    det = DeterminismResult.from_json(summary["determinism"])
    assert det.deterministic is True and det.tensors_compared == summary["baseline"]["tensors"] > 10
    assert RangeCheck.from_json(summary["range_check"]).ok is True
    assert DeterminismResult(deterministic=None, skipped=True).to_json() == {"deterministic": None, "skipped": True}
    arbiter = ArbiterResult.from_json(summary["arbiter"])
    assert arbiter.available and arbiter.judged["truth_source"] and set(arbiter.outputs) == {name}
    skipped = {"available": False, "reason": "skipped (--no-arbiter)", "outputs": {}, "skipped": True}
    assert list(ArbiterResult.from_json(skipped).to_json().items()) == list(skipped.items())
