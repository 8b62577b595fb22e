"""`bisect-tui sessions`: what the session directories hold and how to get rid of them.

A session of a real model keeps every intermediate tensor of the baseline
(hundreds of MB), and each input choice has its own directory, so they pile up.
Listing shows the size and what each one was for; pruning removes only
directories that are bisect-tui sessions (a session.json written by the tool),
never follows a symbolic link, and says what it removed and how much it freed.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from bisect_tui.core import atomic
from bisect_tui.core.errors import UserError
from bisect_tui.core.session import recent_sessions


VERDICT_WORDS = {"pass": "nothing to find", "culprits": "culprit found", "not_fusion": "not a fusion",
                 "no_culprit": "no single culprit"}


@dataclass
class SessionEntry:
    path: Path
    model: str
    inputs: str
    created: str
    last_step: str  # the furthest step that finished, e.g. "bisect: culprits"
    finished: bool  # a check or bisection completed in it
    bytes: int

    @property
    def age_days(self) -> Optional[float]:
        try:
            t = _dt.datetime.fromisoformat(self.created)
        except (TypeError, ValueError):
            return None
        return (_dt.datetime.now(_dt.timezone.utc) - t).total_seconds() / 86400


def dir_size(root: Path) -> int:
    """Bytes under `root`, counting links as links (never following them)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames + dirnames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                total += st.st_size
    return total


def is_session(path: Path) -> bool:
    """A real directory holding a session.json that bisect-tui wrote."""
    if path.is_symlink() or not path.is_dir():
        return False
    meta = path / "session.json"
    if meta.is_symlink() or not meta.is_file():
        return False
    try:
        return atomic.read_json(meta).get("tool") == "bisect-tui"
    except (OSError, ValueError, AttributeError):
        return False


def _inputs_text(opts: dict) -> str:
    from bisect_tui.core.inputs import value_text

    if not opts:
        return "?"
    if opts.get("input_file"):
        return f"file {Path(opts['input_file']).name}"
    parts = [f"seed {opts.get('seed', 0)}"]
    if (opts.get("samples") or 1) != 1:
        parts.append(f"{opts['samples']} samples")
    for k, v in (opts.get("shapes") or {}).items():
        parts.append(f"{k}={'x'.join(map(str, v))}")
    for k, v in (opts.get("input_values") or {}).items():
        parts.append(f"{k}={value_text(v)}")
    return ", ".join(parts)


def describe(path: Path) -> SessionEntry:
    meta = atomic.read_json(path / "session.json")
    steps = meta.get("steps") or {}
    order = ("inputs", "baseline", "determinism", "range_check", "fused", "bisect")
    last = ""
    for s in order:
        st = steps.get(s, {}).get("state")
        if st in ("passed", "failed", "skipped"):
            last = s if s != "bisect" else f"bisect: {VERDICT_WORDS.get(steps[s].get('verdict'), st)}"
            if s == "fused":
                last = f"check: {'pass' if st == 'passed' else 'fail'}"
    finished = steps.get("fused", {}).get("state") in ("passed", "failed") or \
        steps.get("bisect", {}).get("state") in ("passed", "failed")
    return SessionEntry(
        path=path,
        model=Path(meta.get("model_source") or "?").name,
        inputs=_inputs_text(meta.get("input_options") or {}),
        created=meta.get("created") or "",
        last_step=last or "nothing finished",
        finished=finished,
        bytes=dir_size(path),
    )


def find_sessions(base: Path, include_recent: bool = True) -> list[SessionEntry]:
    """Sessions directly under `base` (default ./bisect-sessions) and, optionally,
    the ones the app remembers as recent."""
    seen: set[str] = set()
    paths: list[Path] = []
    if base.is_dir():
        for child in sorted(base.iterdir()):
            if is_session(child):
                paths.append(child)
    if include_recent:
        for e in recent_sessions():
            p = Path(e["session"])
            if is_session(p):
                paths.append(p)
    out = []
    for p in paths:
        key = str(p.resolve())
        if key in seen:
            continue
        seen.add(key)
        out.append(describe(p))
    return out


def human_size(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def select(entries: Iterable[SessionEntry], older_than: Optional[float] = None, unfinished: bool = False,
           everything: bool = False) -> list[SessionEntry]:
    if not (older_than is not None or unfinished or everything):
        raise UserError("say which sessions to prune: --unfinished, --older-than DAYS or --all "
                        "(add --dry-run to only list them)")
    out = []
    for e in entries:
        if everything:
            out.append(e)
            continue
        age = e.age_days
        if older_than is not None and (age is None or age < older_than):
            continue
        if unfinished and e.finished:
            continue
        out.append(e)
    return out


def remove(entry: SessionEntry) -> int:
    """Delete one session directory (checked again right before deleting)."""
    if not is_session(entry.path):
        raise UserError(f"{entry.path} is no longer a bisect-tui session; not removed")
    shutil.rmtree(entry.path)  # rmtree never follows symlinks inside the tree
    return entry.bytes
