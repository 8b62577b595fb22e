"""The command's start: the determinism check's second interpreter is started
before this one imports numpy, onnx or the engine contract (it is the longest
path of a small model's check), only for a command that will use it, and it never
outlives the command, even when argparse exits before main()'s cleanup."""

import json
import os
import subprocess
import sys

import pytest

from bisect_tui import cli
from bisect_tui.core import second_run
from bisect_tui.core.threads import cores

needs_two_cores = pytest.mark.skipif(cores() < 2, reason="one core: no second interpreter is prestarted")


def test_cli_module_imports_nothing_before_the_prestart():
    out = subprocess.run([sys.executable, "-c", "import sys, bisect_tui.cli; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    mods = set(out.stdout.split())
    assert "bisect_tui.cli" in mods
    assert not {m for m in mods if m.startswith("bisect_tui.") and m != "bisect_tui.cli"}, mods
    assert "numpy" not in mods and "dataclasses" not in mods


@needs_two_cores
@pytest.mark.parametrize("argv, started", [
    (["check", "m.onnx"], True),
    (["bisect", "m.onnx", "--workers", "1"], True),
    (["check", "m.onnx", "--no-determinism"], False),
    (["check", "m.onnx", "--no-det"], False),  # argparse takes the abbreviation
    (["bisect", "m.onnx", "--help"], False),
    (["tui", "m.onnx"], False),
    (["sessions"], False),
    ([], False),
])
def test_early_prestart_only_for_a_command_that_uses_it(argv, started):
    assert not second_run._PRESTARTED
    try:
        cli._prestart_early(argv)
        procs = list(second_run._PRESTARTED)
        assert len(procs) == (1 if started else 0)
        for p in procs:
            assert p.poll() is None  # alive, waiting for its plan
            assert "bisect_tui.core.second_run" in p.args
    finally:
        second_run.stop_prestarted()
    assert not second_run._PRESTARTED
    for p in procs:
        assert p.returncode is not None  # killed and reaped


DRIVER = """
import json, sys
from bisect_tui import cli
from bisect_tui.core import second_run
started, out = [], sys.argv[1]
orig = second_run.prestart
def prestart(spec=None):
    orig(spec)
    started.extend(p.pid for p in second_run._PRESTARTED)
    with open(out, "w") as fh:
        json.dump(started, fh)
second_run.prestart = prestart
sys.argv = ["bisect-tui"] + sys.argv[2:]
cli.entry()
"""


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@needs_two_cores
@pytest.mark.parametrize("args, code", [
    (["check", "MODEL", "--no-such-flag"], 2),  # argparse's SystemExit, before main()'s try
    (["bisect", "MODEL", "--max-builds", "x"], 2),
    (["check", "MISSING"], 2),  # main()'s own cleanup: a user error
])
def test_a_prestarted_interpreter_never_outlives_the_command(tmp_path, args, code):
    pids = tmp_path / "pids.json"
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    argv = [str(model) if a == "MODEL" else str(tmp_path / "missing.onnx") if a == "MISSING" else a for a in args]
    r = subprocess.run([sys.executable, "-c", DRIVER, str(pids), *argv], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == code, r.stderr[-2000:]
    started = json.loads(pids.read_text())
    assert started, "the early prestart did not happen: nothing was tested"
    # the command kills and reaps them before it exits (second_run.stop_prestarted): one
    # left alone would still be importing now, so none may be alive once it has returned
    assert not [p for p in started if _alive(p)], r.stderr[-2000:]


def test_collector_paused_for_the_imports_then_running(tmp_path):
    """The console entry pauses the garbage collector for a check's imports
    (startup_gc.py); the command turns it back on, with what the imports made
    frozen, and main() turns it on even when the command fails before that."""
    import gc

    from bisect_tui import cli
    from bisect_tui.core import startup_gc

    assert gc.isenabled()
    before = gc.get_threshold()
    try:
        startup_gc.pause()
        assert not gc.isenabled()
        # refused while its options are read, before its imports are done
        assert cli.main(["check", str(tmp_path / "m.onnx"), "--max-memory", "lots"]) == 2
        assert gc.isenabled() and gc.get_freeze_count() == 0
        startup_gc.pause()
        startup_gc.imports_done()
        assert gc.isenabled() and gc.get_freeze_count() > 0 and gc.get_threshold() == startup_gc.THRESHOLDS
        startup_gc.resume()  # nothing left to resume
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        gc.enable()
