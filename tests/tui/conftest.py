"""Fixtures for the app tests: the real app, real onnxruntime, no mocks.

Every test runs in its own working directory (a tmp dir) holding a copy of the
sample model it needs, with the session directory given as a relative path, so
what the app shows (paths relative to the cwd) is the same on every machine:
that keeps the snapshots deterministic.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tui_helpers import gelu_options  # noqa: E402


@pytest.fixture
def workdir(tmp_path, monkeypatch, samples) -> Path:
    """A fresh cwd with transformer_block.onnx and deep_stack.onnx copied in."""
    wd = tmp_path / "work"
    wd.mkdir()
    for name in ("transformer_block.onnx", "deep_stack.onnx"):
        shutil.copy(samples / name, wd / name)
    monkeypatch.chdir(wd)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return wd


@pytest.fixture
def hold_after(monkeypatch):
    """`hold_after(owner, name)`: after `owner.name` has done its real work, its worker
    thread keeps the CPU and the GIL busy in pure Python until the test sets the returned
    event, so keys are pressed while the work is certainly running, however fast the
    machine. Teardown releases every hold, so a failing test leaves no thread spinning."""
    releases: list[threading.Event] = []

    def hold(owner, name: str) -> threading.Event:
        release = threading.Event()
        real = getattr(owner, name)

        def held(*args, **kwargs):
            out = real(*args, **kwargs)
            deadline = time.monotonic() + 60
            while not release.is_set() and time.monotonic() < deadline:
                sum(i * i for i in range(20000))  # holds the GIL between switches, like real Python work
            return out

        monkeypatch.setattr(owner, name, held)
        releases.append(release)
        return release

    yield hold
    for release in releases:
        release.set()


@pytest.fixture
def gelu(workdir):
    """TriageOptions for transformer_block with the Gelu approximation (it breaks fp32)."""
    return gelu_options("transformer_block.onnx")


@pytest.fixture(autouse=True)
def _timing(request):
    t0 = time.perf_counter()
    yield
    request.node.user_properties.append(("seconds", round(time.perf_counter() - t0, 2)))
