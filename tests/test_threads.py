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
