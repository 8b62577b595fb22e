"""`bisect-tui sessions`: what the session directories hold and how to get rid of them.

A session of a real model keeps every intermediate tensor of the baseline
(hundreds of MB), and each input choice has its own directory, so they pile up.
Listing shows the size and what each one was for; pruning removes only
directories that are bisect-tui sessions (a session.json written by the tool),
never follows a symbolic link, and says what it removed and how much it freed.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

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
    damaged: str = ""  # why its session.json cannot be read: listed, never pruned

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


# a session.json of a 21,600-node bisection is a few MB; far beyond that is not ours
META_MAX_BYTES = 64 << 20


def _meta(path: Path) -> dict:
    """session.json, bounded in size and depth (one hand-edited file nested
    100,000 deep made `sessions list` crash for every session)."""
    from bisect_tui.core.bounded import parse_json, read_text_capped

    data = parse_json(read_text_capped(path / "session.json", "session.json", META_MAX_BYTES),
                      "session.json")
    if not isinstance(data, dict):
        raise UserError("session.json is not a JSON object")
    return data


def _has_meta(path: Path) -> bool:
    if path.is_symlink() or not path.is_dir():
        return False
    meta = path / "session.json"
    return not meta.is_symlink() and meta.is_file()


def is_session(path: Path) -> bool:
    """A real directory holding a session.json that bisect-tui wrote."""
    if not _has_meta(path):
        return False
    try:
        return _meta(path).get("tool") == "bisect-tui"
    except (OSError, UserError):
        return False


def _damaged(path: Path) -> str:
    """Why a directory that looks like a session (a session.json naming the tool
    in its first bytes) cannot be read; "" when it reads or is not one of ours."""
    if not _has_meta(path):
        return ""
    try:
        _meta(path)
        return ""
    except (OSError, UserError) as exc:
        try:
            with open(path / "session.json", "rb") as fh:
                head = fh.read(4096)
        except OSError:
            return ""
        return str(exc) if b'"bisect-tui"' in head else ""


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
    meta = _meta(path)
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
    damaged: list[SessionEntry] = []
    if base.is_dir():
        for child in sorted(base.iterdir()):
            if is_session(child):
                paths.append(child)
            elif why := _damaged(child):
                damaged.append(SessionEntry(child, "?", "?", "", f"damaged: {why}", False, dir_size(child), why))
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
        try:
            out.append(describe(p))
        except (OSError, UserError) as exc:  # changed since is_session read it
            out.append(SessionEntry(p, "?", "?", "", f"damaged: {exc}", False, dir_size(p), str(exc)))
    return out + damaged


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
    if older_than is not None and not (math.isfinite(older_than) and older_than >= 0):
        raise UserError(f"--older-than {older_than}: give a number of days, 0 or more")
    out = []
    for e in entries:
        if e.damaged:  # cannot be proven ours: listed, never removed
            continue
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
