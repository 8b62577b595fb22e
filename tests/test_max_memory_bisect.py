"""`--max-memory` bounds the search, not only the dump: a build starts beside another
(a prefetch, an early build) only when both fit, and a budget below one whole-graph
build is refused in one line (exit 2) before any work."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

from bisect_tui.core import background
from bisect_tui.core.bisect.limits import build_memory, builds_beside_fit
from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.core.errors import UserError
from bisect_tui.core.memory import MB, build_footprint
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.api import EngineConfig

from testlib import REPO

sys.path.insert(0, str(REPO / "bench"))
from scale_models import two_culprit_stack  # noqa: E402


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    d = tmp_path_factory.mktemp("ln0mem")
    model, expected = two_culprit_stack(10, 6)
    path = d / "ln0_150.onnx"
    onnx.save(model, str(path))
    np.savez(d / "x.npz", x=np.random.default_rng(0).standard_normal([1, 16, 16]).astype(np.float32))
    return path, d / "x.npz", expected


def _triage(stack, root, max_memory=0):
    path, inputs, _ = stack
    t = Triage(TriageOptions(model=path, session_dir=root, config=EngineConfig(), input_file=inputs,
                             max_memory=max_memory))
    t.run_all()
    assert t.fused["passed"] is False
    return t


def _answer(res):
    return ([(c["original_nodes"], c["exposed_by"], c["attribution"]["confirmed"]) for c in res["culprits"]],
            res["workaround"]["disabled_optimizers"], res["workaround"]["full_engine"]["passed"])


def test_footprint_counts_weights_nodes_and_every_tensor():
    assert build_footprint(1000, 10 * MB, 50 * MB) - build_footprint(0, 0, 0) == 20 * MB + 1000 * (16 << 10) + 50 * MB


def test_a_budget_for_one_build_makes_no_build_beside_and_the_same_answer(stack, tmp_path, monkeypatch):
    started = []
    real = background.start

    def spy(fn, *args, name=None, **kw):  # the real thread, counted
        started.append(name)
        return real(fn, *args, name=name, **kw)

    monkeypatch.setattr(background, "start", spy)
    free = _triage(stack, tmp_path / "free")
    assert builds_beside_fit(free)  # the default budget (a quarter of free RAM) holds two
    started.clear()
    wide = run_bisection(free)
    assert "prefetch-build" in started  # builds beside the search's work

    t = _triage(stack, tmp_path / "tight")
    footprint, held, _ = build_memory(t)
    t.opts.max_memory = held + footprint + footprint // 2  # one build fits, two do not
    assert build_memory(t)[2] == 1 and not builds_beside_fit(t)
    started.clear()
    tight = run_bisection(t)
    assert "prefetch-build" not in started
    assert _answer(tight) == _answer(wide)
    path, _, expected = stack
    assert [c[0] for c in _answer(tight)[0]] == expected


def test_a_budget_below_one_build_is_refused_in_one_line(stack, tmp_path):
    t = _triage(stack, tmp_path / "small")
    footprint, held, _ = build_memory(t)
    t.opts.max_memory = held + footprint // 2
    with pytest.raises(UserError) as err:
        run_bisection(t)
    msg = str(err.value)
    assert "\n" not in msg and "--max-memory" in msg and "give at least --max-memory" in msg
    assert not (t.session.bisect_dir / "steps.jsonl").exists()  # refused before the first step


def test_cli_refuses_a_tiny_budget_before_the_dump(stack, tmp_path):
    path, inputs, _ = stack
    sess = tmp_path / "cli"
    p = subprocess.run([sys.executable, "-m", "bisect_tui", "bisect", str(path), "--session", str(sess),
                        "--input", str(inputs), "--max-memory", "8M", "-q"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bisect-tui: error: --max-memory 8M is below what one "
                                                   "whole-graph build of this model needs"), p.stderr
    assert not (sess / "baseline").exists()  # nothing dumped


def test_freed_memory_is_given_back_before_a_budget_is_refused(stack, tmp_path, monkeypatch):
    """What the process holds is its RSS, freed memory the allocator kept included (1.8 GB
    after the float64 arbiter at 21,000 nodes, which refused a 2G search that then ran in
    1.8 GB): the check gives it back and measures again before refusing."""
    from bisect_tui.core import memory
    from bisect_tui.core.bisect import limits

    t = _triage(stack, tmp_path / "s")
    footprint, held, _ = build_memory(t)
    t.opts.max_memory = held + footprint + 64 * MB  # one build fits beside what is really held
    released = []
    monkeypatch.setattr(memory, "release_memory", lambda: released.append(True))
    monkeypatch.setattr(memory, "process_floor", lambda: held + (0 if released else 2 * footprint))
    limits.check_build_memory(t)  # refused on the first look, fits after the release
    assert released == [True]
    released.clear()
    monkeypatch.setattr(memory, "process_floor", lambda: held + 2 * footprint)  # nothing to give back
    with pytest.raises(UserError, match="give at least --max-memory"):
        limits.check_build_memory(t)
    assert released == [True]
