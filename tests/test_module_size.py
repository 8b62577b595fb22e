"""Modules hold one idea each: none of bisect_tui/ grows past 500 lines (issue 20).
A module that needs more is two ideas; split it rather than raise the limit."""

from __future__ import annotations

from testlib import REPO

LIMIT = 500


def test_no_module_over_the_limit():
    sizes = {p.relative_to(REPO).as_posix(): sum(1 for _ in p.open(encoding="utf-8"))
             for p in (REPO / "bisect_tui").rglob("*.py")}
    assert len(sizes) > 100  # the walk really found the package
    over = {p: n for p, n in sizes.items() if n > LIMIT}
    assert not over, f"modules over {LIMIT} lines: {over}"
