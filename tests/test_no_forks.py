"""The run's machine record forks no helper process: `platform.platform()` and
`platform.processor()` run `uname -p`, `ctypes.util.find_library` runs `ldconfig -p`,
each a copy of a process that may hold the dump at its peak (a memory sampler read
the pair as twice the process: a 1,304 MiB peak of a 780 MiB run, issue 24)."""

from __future__ import annotations

import platform
import subprocess

from bisect_tui.core.baseline import _cpu_name, _platform_name, versions
from bisect_tui.engines.ort.unfused import OrtUnfused


def test_the_version_record_forks_nothing_and_says_the_same(monkeypatch):
    want = platform.platform()
    spawned: list = []
    real = subprocess.Popen.__init__

    def record(self, *a, **k):
        spawned.append(a[0] if a else k.get("args"))
        return real(self, *a, **k)

    monkeypatch.setattr(subprocess.Popen, "__init__", record)
    monkeypatch.setattr(platform, "_uname_cache", None)  # asked afresh, as a new process would
    monkeypatch.setattr(platform, "_platform_cache", {})
    got = versions(OrtUnfused())
    assert spawned == []
    assert got["platform"] == _platform_name() == want
    assert got["cpu"] == _cpu_name() and got["cpu"]


def test_libc_is_found_without_ldconfig(monkeypatch):
    from bisect_tui.core import memory

    spawned: list = []
    real = subprocess.Popen.__init__
    monkeypatch.setattr(subprocess.Popen, "__init__",
                        lambda self, *a, **k: (spawned.append(a[0] if a else k.get("args")), real(self, *a, **k))[1])
    assert memory._libc_trim() is not None  # glibc here, by its own name
    assert spawned == []
