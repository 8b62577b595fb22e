"""Whole-graph builds are handed what they need (api.BuildContext: the shapes
the triage runs, its saved inputs, the session's cache folder, progress and
cancel) instead of digging them out of the session directory."""

from __future__ import annotations

from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.core.pipeline import Triage, TriageOptions

from fake_engine import FakeEngine, save_two_linear


class RecordingEngine(FakeEngine):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.contexts = []

    def build(self, model_path, config, marked=(), workdir=None, *, context=None):
        self.contexts.append((list(marked), context))
        return super().build(model_path, config, marked, workdir, context=context)


def test_check_and_search_builds_get_the_triage_context(tmp_path):
    path = tmp_path / "two_linear.onnx"
    fused = save_two_linear(path)
    engine = RecordingEngine(fused, {"Gemm_2": 0.5})
    triage = Triage(TriageOptions(model=path, session_dir=tmp_path / "s"), engine=engine)
    assert triage.run_all()["verdict"] == "fail"
    assert run_bisection(triage)["verdict"] == "culprits"
    whole = [c for _, c in engine.contexts if c is not None]
    assert len(whole) >= 3, engine.contexts  # the check's build and the search's
    session = triage.session.root
    for ctx in whole:
        assert dict(ctx.input_shapes) == {k: tuple(v) for k, v in triage.shapes.items()}
        assert ctx.feeds_file == triage.session.inputs_path and ctx.feeds_file.is_file()
        assert ctx.cache_dir == session / "engines"
    # the check's build runs in this process: it reports and can be cancelled
    first = whole[0]
    assert first.progress is not None and first.cancel_check is not None
    first.cancel_check()  # not cancelled: returns
    triage.cancel.cancel()
    try:
        first.cancel_check()
        raise AssertionError("a cancelled triage's build context did not stop")
    except Exception as exc:  # Cancelled
        assert type(exc).__name__ == "Cancelled"
