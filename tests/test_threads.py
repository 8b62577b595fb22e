"""BLAS thread counts for this tool's processes (core/threads.py)."""

from __future__ import annotations

import subprocess
import sys

from bisect_tui.core.threads import BLAS_THREAD_VARS, cores, limit_blas


def test_limits_unset_counts_and_keeps_the_users():
    env = limit_blas({"MKL_NUM_THREADS": "7"})
    assert env["MKL_NUM_THREADS"] == "7"
    assert env["OPENBLAS_NUM_THREADS"] == str(max(1, cores() - 1))


def test_the_console_script_and_its_second_run_get_the_limit(tmp_path):
    """The environment is set before numpy loads (numpy's BLAS reads it once), and
    the second run inherits it."""
    code = ("import os, sys\n"
            "from bisect_tui.core.threads import limit_blas\n"
            "limit_blas(os.environ)\n"
            "import numpy\n"
            "from bisect_tui.core.second_run import child_env\n"
            "print(os.environ['OPENBLAS_NUM_THREADS'], child_env()['OPENBLAS_NUM_THREADS'])\n")
    env = {k: v for k, v in __import__("os").environ.items() if k not in BLAS_THREAD_VARS}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    want = str(max(1, cores() - 1))
    assert out.stdout.split() == [want, want]


def test_the_second_run_runs_below_the_process_that_started_it():
    """Its interpreter, started as the checklist starts it (waiting on its stdin for
    the plan), is second_run.NICE steps lower than this process from its first
    imports on: it works beside the engine under test's build, which the check
    waits on first. Read from /proc while it waits; closing its stdin ends it."""
    import os
    import time
    from pathlib import Path

    import pytest

    from bisect_tui.core.second_run import NICE, child_env

    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc here to read a process's nice value from")
    proc = subprocess.Popen([sys.executable, "-m", "bisect_tui.core.second_run", "--stdin"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=child_env())
    want = min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
    try:
        end = time.monotonic() + 30
        nice = None
        while time.monotonic() < end and proc.poll() is None:
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
            nice = int(stat.rsplit(")", 1)[1].split()[16])  # field 19: nice
            if nice == want:
                break
            time.sleep(0.01)  # a look at another process's state, not a guessed wait for it
        assert nice == want, (nice, want)
    finally:
        proc.stdin.close()  # an empty plan: "not needed after all"
        proc.stdout.read()
        err = proc.stderr.read()
        proc.wait(60)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == 0, err
