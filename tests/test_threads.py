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
    the plan), runs second_run.NICE steps lower than this process: it works beside the
    engine under test's build, which the check waits on first. Its stdin closed (an
    empty plan: "not needed after all"), it exits; its nice value is read from /proc
    once it has exited and before it is reaped, so nothing is polled."""
    import os
    from pathlib import Path

    import pytest

    from bisect_tui.core.second_run import NICE, child_env

    if not Path("/proc/self/stat").exists() or not hasattr(os, "waitid"):
        pytest.skip("no /proc or waitid here to read an exited process's nice value")
    proc = subprocess.Popen([sys.executable, "-m", "bisect_tui.core.second_run", "--stdin"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=child_env())
    want = min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
    try:
        proc.stdin.close()
        err = proc.stderr.read()  # to its end: the child has closed it, exiting
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
        nice = int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])  # field 19
    finally:
        proc.wait(60)
        proc.stderr.close()
    assert proc.returncode == 0, err
    assert nice == want, (nice, want)
