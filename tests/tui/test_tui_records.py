"""The app holds the core's frozen records, never their JSON (issue 20): a dict
in the state would let a screen read a key the record does not promise, and a
worker could change it under a screen that is painting."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bisect_tui.core.bisect.records import BisectResult
from bisect_tui.core.triage.records import CheckResult, DeterminismResult, RangeCheck, Summary
from bisect_tui.tui.app import make_app
from tui_helpers import wait_idle


async def test_a_real_check_leaves_frozen_records_in_the_app_state(gelu, workdir):
    app = make_app(dataclasses.replace(gelu, arbiter=False))  # the float64 run is not what this is about
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")
        await wait_idle(pilot)
        st = app.state
        assert st.states["fused"] == "failed"
        for value, kind in ((st.determinism, DeterminismResult), (st.range_check, RangeCheck),
                            (st.fused, CheckResult), (st.summary, Summary)):
            assert isinstance(value, kind), f"{type(value).__name__} where a {kind.__name__} belongs"
        with pytest.raises(dataclasses.FrozenInstanceError):
            st.summary.verdict = "pass"
        with pytest.raises(dataclasses.FrozenInstanceError):
            st.fused.passed = True
        assert st.summary.check is st.fused  # one snapshot: the summary holds the comparison shown
        # the records write what the session holds, key for key and in order
        root = st.session_root
        assert json.dumps(st.fused.to_json()) == json.dumps(json.loads((root / "check.json").read_text()))
        assert json.dumps(st.determinism.to_json()) == json.dumps(
            json.loads((root / "determinism.json").read_text()))


def test_a_result_read_back_keeps_its_key_order():
    """The app posts the result as a record and exports its JSON: the search's own
    keys sit among the record's in result.json, and they stay where they were."""
    on_disk = {"schema": "bisect-tui/bisect-result/1", "started": "t0", "config": {}, "verdict": "pass",
               "culprits": [], "units": [], "level": "all", "steps": [], "engine_builds": 0,
               "reused_steps": 0, "probe_agrees": None, "layers": [], "workaround": None, "precision": None,
               "subgraph_builds": 0, "parallel": {}, "untrusted_steps": 0, "finished": "t1", "tolerance": {}}
    again = BisectResult.from_json(on_disk)
    assert list(again.to_json()) == list(on_disk) and again.to_json() == on_disk
