"""The search's "all fusions blocked" build, started while the check runs
(core/bisect/early.py): real ORT builds on the bundled samples."""

from __future__ import annotations

import os
from pathlib import Path
import threading

import pytest

from bisect_tui.core.bisect.early import BLOCKED_NICE
from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.api import EngineConfig
from bisect_tui.engines.ort.engine import OrtEngine

GELU = EngineConfig(config_entries=(("optimization.enable_gelu_approximation", "1"),))


def _triage(model, root, ahead: bool, config=GELU) -> Triage:
    t = Triage(TriageOptions(model=model, session_dir=root, config=config), lambda p: None)
    t.search_ahead = ahead  # what the bisect command sets
    t.run_all()
    return t


def _blocked_threads(monkeypatch, nices: list | None = None) -> list[str]:
    """The threads that built the engine with every tensor marked (`nices`: their
    nice values, where the platform has them)."""
    seen: list[str] = []
    real = OrtEngine.build

    def build(self, model_path, config, marked=(), workdir=None, *, context=None):
        if len(marked) > 10:
            seen.append(threading.current_thread().name)
            if nices is not None and hasattr(os, "getpriority"):
                nices.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return real(self, model_path, config, marked, workdir, context=context)

    monkeypatch.setattr(OrtEngine, "build", build)
    return seen


def _shape(r: dict) -> list:
    return [(s["kind"], s["passed"], s["ratio"], s["builds"], s["cached"], s.get("worker")) for s in r["steps"]]


def test_the_search_takes_the_blocked_build_made_during_the_check(samples, tmp_path, monkeypatch):
    seen = _blocked_threads(monkeypatch)
    t = _triage(samples / "deep_stack.onnx", tmp_path / "ahead", True)
    assert seen and seen[0].startswith("blocked-build")  # started before the search, in its thread
    assert t.search_builds  # made, not yet taken
    ahead = run_bisection(t)
    assert not t.search_builds and len(seen) == 1  # taken by the search: not built twice
    plain = run_bisection(_triage(samples / "deep_stack.onnx", tmp_path / "plain", False))
    assert len(seen) == 2 and not seen[1].startswith("blocked-build")  # the search's own (its prefetch)
    assert _shape(ahead) == _shape(plain)
    assert ahead["engine_builds"] == plain["engine_builds"]
    assert [c["original_nodes"] for c in ahead["culprits"]] == [c["original_nodes"] for c in plain["culprits"]]
    blocked = next(s for s in ahead["steps"] if s["kind"] == "all fusions blocked")
    assert blocked["passed"] and blocked["marks"] > 10


def test_a_passing_check_leaves_it_unrecorded_and_uncounted(samples, tmp_path, monkeypatch):
    seen = _blocked_threads(monkeypatch)
    t = _triage(samples / "passing_stack.onnx", tmp_path / "s", True)
    assert t.fused["passed"]
    res = run_bisection(t)
    assert res["verdict"] == "pass" and res["engine_builds"] == 0
    assert [s["kind"] for s in res["steps"]] == ["full engine"]
    assert len(seen) == 1 and seen[0].startswith("blocked-build")  # built, asked for by nobody


def test_a_resumed_search_does_not_start_it(samples, tmp_path, monkeypatch):
    run_bisection(_triage(samples / "deep_stack.onnx", tmp_path / "s", False))
    seen = _blocked_threads(monkeypatch)
    t = _triage(samples / "deep_stack.onnx", tmp_path / "s", True)
    assert not t.search_builds
    again = run_bisection(t)
    assert not seen and again["engine_builds"] == 0  # every step read back from the session


def test_the_suspects_attribution_build_starts_after_the_check_and_is_taken(samples, tmp_path, monkeypatch):
    """After a failing check, the probe's first suspect's pass is found on its
    subgraph and the full engine without it is built in a thread before the search
    starts (what the bisect command does); the search's attribution takes it. Steps,
    build count, the pass and the rest proof are those of the search without it."""
    from bisect_tui.core.bisect.early import start_attribution_build

    seen: list[str] = []
    real = OrtEngine.build

    def build(self, model_path, config, marked=(), workdir=None, *, context=None):
        if config.disabled_passes and not marked and workdir is not None:
            seen.append(threading.current_thread().name)
        return real(self, model_path, config, marked, workdir, context=context)

    monkeypatch.setattr(OrtEngine, "build", build)
    t = _triage(samples / "transformer_block.onnx", tmp_path / "early", True)
    assert not t.fused["passed"]
    start_attribution_build(t)
    assert seen and seen[0].startswith("attribution-build") and len(t.search_builds) == 2  # with the blocked
    early = run_bisection(t)
    assert len(seen) == 1 and not t.search_builds  # taken: not built again
    plain = run_bisection(_triage(samples / "transformer_block.onnx", tmp_path / "plain", False))
    assert _shape(early) == _shape(plain) and early["engine_builds"] == plain["engine_builds"]
    assert [c["attribution"]["confirmed"] for c in early["culprits"]] == [["GeluApproximation"]]
    assert ([c["attribution"]["group_test"]["found"] for c in early["culprits"]]
            == [c["attribution"]["group_test"]["found"] for c in plain["culprits"]])
    assert early["rest_proven_by"] == plain["rest_proven_by"]


def test_no_attribution_build_ahead_of_a_passing_check(samples, tmp_path):
    from bisect_tui.core.bisect.early import start_attribution_build

    t = _triage(samples / "passing_stack.onnx", tmp_path / "s", True)
    start_attribution_build(t)
    assert [k[0] for k in t.search_builds] == [repr(sorted(GELU.to_dict().items()))]  # the blocked build only


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no thread priorities here")
@pytest.mark.parametrize("engine_still_building", [True, False], ids=["beside the engine's build", "after it"])
def test_it_yields_to_the_engine_under_test_only_while_that_is_built(samples, tmp_path, monkeypatch,
                                                                      engine_still_building):
    """Lowered (BLOCKED_NICE) while the engine under test is still being built, which
    the check waits on next; at the search's own priority once that build is done, as
    it is then next on the search's path. Which of the two holds is made certain here:
    the engine's build is held until this one starts, or this one until that is done."""
    import bisect_tui.core.bisect.early as early_mod

    nices: list[int] = []
    seen = _blocked_threads(monkeypatch, nices)
    started = threading.Event()
    real_build = OrtEngine.build

    def build(self, model_path, config, marked=(), workdir=None, *, context=None):
        if len(marked) > 10:
            started.set()
        got = real_build(self, model_path, config, marked, workdir, context=context)
        if engine_still_building and not marked and threading.current_thread().name.startswith("fused-build"):
            assert started.wait(60), "the blocked build never started"
        return got

    monkeypatch.setattr(OrtEngine, "build", build)
    real_start = early_mod.start_blocked_build

    def start_blocked_build(triage):
        if not engine_still_building:
            triage._fused_build[2].result()  # the engine under test is built
        return real_start(triage)

    monkeypatch.setattr(early_mod, "start_blocked_build", start_blocked_build)
    _triage(samples / "deep_stack.onnx", tmp_path / "s", True)
    assert seen and seen[0].startswith("blocked-build")
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert nices[0] == (min(19, mine + BLOCKED_NICE) if engine_still_building else mine)


def test_the_bisect_command_starts_it_from_the_probe_before_the_check_is_written(samples, tmp_path, monkeypatch):
    """Triage.after_probe (set by the bisect command): the attribution build starts
    once the probe and the map are in, before check.json is written, and only once
    although the command asks again after the checklist."""
    import functools

    from bisect_tui.core.bisect.early import start_attribution_build

    seen: list[bool] = []
    started = threading.Event()
    real = OrtEngine.build

    def build(self, model_path, config, marked=(), workdir=None, *, context=None):
        if config.disabled_passes and not marked and workdir is not None:
            seen.append((Path(workdir).parents[1] / "check.json").exists())
            started.set()
        return real(self, model_path, config, marked, workdir, context=context)

    monkeypatch.setattr(OrtEngine, "build", build)
    t = Triage(TriageOptions(model=samples / "transformer_block.onnx", session_dir=tmp_path / "s", config=GELU),
               lambda p: None)
    t.search_ahead = True
    t.after_probe = functools.partial(start_attribution_build, t)
    t.run_all()
    assert not t.fused["passed"]
    assert started.wait(30)
    assert seen == [False]  # started from the hook, before the check's file
    start_attribution_build(t)  # what the command does after the checklist: nothing more
    result = run_bisection(t)
    assert seen == [False] and not t.search_builds
    assert [c["attribution"]["confirmed"] for c in result["culprits"]] == [["GeluApproximation"]]
