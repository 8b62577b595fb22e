"""Resume checks a session against the engine's declared capabilities, not a
fixed list of precisions: an interrupted OpenVINO bf16 bisection resumes (it
was refused as "not fp32 or fp16" before), and what the engine does not
declare is still refused."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openvino")

from bisect_tui.api import EngineConfig  # noqa: E402
from bisect_tui.cli import main  # noqa: E402
from bisect_tui.core.bisect.run import run_bisection  # noqa: E402
from bisect_tui.core.errors import Cancelled, UserError  # noqa: E402
from bisect_tui.core.pipeline import Triage, TriageOptions  # noqa: E402
from bisect_tui.core.resume import options_from_session  # noqa: E402
from bisect_tui.core.tolerance import parse_tolerance  # noqa: E402
from bisect_tui.engines.openvino.engine import OpenVinoEngine  # noqa: E402
from bisect_tui.engines.registry import get_engine  # noqa: E402

CULPRIT = ["norm/reduce", "norm/add_eps", "norm/sqrt"]


class CancelAtBuild(OpenVinoEngine):
    """The real OpenVINO engine; its `at`-th build sets the triage's cancel token
    (what Ctrl-C or the app's cancel does), so the search stops at a known step."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at
        self.builds = 0
        self.triage = None

    def build(self, *args, **kwargs):
        self.builds += 1
        if self.builds == self.at and self.triage is not None:
            self.triage.cancel.cancel()
        return super().build(*args, **kwargs)


def _opts(samples, sess):
    return TriageOptions(model=samples / "ov_rmsnorm.onnx", session_dir=sess, engine="openvino",
                         config=EngineConfig(precision="bf16"), tolerance=parse_tolerance("bf16"))


def test_interrupted_openvino_bf16_bisect_resumes(samples, tmp_path, capsys):
    sess = tmp_path / "s"
    engine = CancelAtBuild(at=3)  # build 1: the check's full engine; 2, 3: the search's
    first = Triage(_opts(samples, sess), engine=engine)
    engine.triage = first
    first.run_all()
    with pytest.raises(Cancelled):
        run_bisection(first)
    assert first.session.step_state("bisect") == "cancelled"
    done = len((sess / "bisect" / "steps.jsonl").read_text().splitlines())
    assert done >= 1  # the steps before the cancel were recorded

    opts = options_from_session(sess, get_engine)
    assert opts.engine == "openvino" and opts.config.precision == "bf16"
    code = main(["resume", str(sess), "--headless", "-q"])
    capsys.readouterr()
    assert code == 1  # culprits found
    b = json.loads((sess / "report.json").read_text())["bisect"]
    assert b["verdict"] == "culprits"
    assert [c["original_nodes"] for c in b["culprits"]] == [CULPRIT]
    assert b["reused_steps"] >= done
    assert b["workaround"]["kind"] == "mark_outputs"


def _edited(samples, tmp_path, **config):
    """A finished OpenVINO session whose session.json is then edited by hand."""
    sess = tmp_path / "e"
    Triage(_opts(samples, sess)).run_all()
    meta = json.loads((sess / "session.json").read_text())
    meta["options"]["config"].update(config)
    (sess / "session.json").write_text(json.dumps(meta))
    return sess


def test_what_the_engine_does_not_declare_is_refused(samples, tmp_path):
    sess = _edited(samples, tmp_path, level="basic")  # OpenVINO has no levels
    with pytest.raises(UserError, match="level 'basic' is not one of all for OpenVINO"):
        options_from_session(sess, get_engine)
    sess = _edited(samples, tmp_path / "p", level="all", precision="int4")
    with pytest.raises(UserError, match="precision 'int4' is not one of fp32, bf16, fp16 for OpenVINO"):
        options_from_session(sess, get_engine)
