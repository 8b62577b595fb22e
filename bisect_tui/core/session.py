"""The triage session directory: the single source of truth on disk.

Layout (every file written atomically; later steps only add files):

    session.json            model source + hash, input options, state of each step
    model.onnx              the prepared model (every node named) all engines read
    input.npz               the exact inputs, leading samples axis
    input_source.json       seed or source file the inputs came from
    baseline/               layer_{index:04d}_{op}_{tensor}.npy, manifest.json (last), run.json
    determinism.json        second baseline run compared bit for bit
    range_check.json        NaN/Inf origin, FP16/BF16 headroom, user ranges
    engines/<key>/          optimized graph and fused-node map per engine config
    check.json              fused engine vs baseline comparison
    bisect/                 steps.jsonl (append-only), state.json, culprits
    report.md / report.json / bundle.zip

A rerun over the same directory reuses every result whose key (hash of what
it depends on) still matches, which is how an interrupted run resumes.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

from bisect_tui import __version__
from bisect_tui.core import atomic
from bisect_tui.core.errors import UserError

STEPS = ("inputs", "baseline", "determinism", "range_check", "fused", "bisect", "report")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def stable_key(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def default_session_dir(model_path: Path, model_sha: str, base: Optional[Path] = None,
                        inputs_key: Optional[str] = None) -> Path:
    """`<model>-<hash>`, plus `-<inputs hash>` when the inputs are not the defaults:
    another shape or seed is another directory, so runs never lock each other out."""
    base = Path(base) if base else Path.cwd() / "bisect-sessions"
    return base / (f"{Path(model_path).stem}-{model_sha[:8]}" + (f"-{inputs_key[:6]}" if inputs_key else ""))


def state_home() -> Path:
    root = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(root) / "bisect-tui"


class Session:
    def __init__(self, root: Path):
        self.root = Path(root)

    # paths -----------------------------------------------------------------
    @property
    def meta_path(self) -> Path:
        return self.root / "session.json"

    @property
    def model_path(self) -> Path:
        return self.root / "model.onnx"

    @property
    def inputs_path(self) -> Path:
        return self.root / "input.npz"

    @property
    def input_source_path(self) -> Path:
        return self.root / "input_source.json"

    @property
    def baseline_dir(self) -> Path:
        return self.root / "baseline"

    @property
    def manifest_path(self) -> Path:
        return self.baseline_dir / "manifest.json"

    @property
    def engines_dir(self) -> Path:
        return self.root / "engines"

    @property
    def bisect_dir(self) -> Path:
        return self.root / "bisect"

    def path(self, name: str) -> Path:
        return self.root / name

    # metadata --------------------------------------------------------------
    def exists(self) -> bool:
        return self.meta_path.exists()

    def meta(self) -> dict:
        if not self.meta_path.exists():
            return {}
        return atomic.read_json(self.meta_path)

    def init(self, model_source: Path, model_sha: str, input_options: dict, named: bool = True) -> dict:
        """Create the session or check that an existing one is for the same model and inputs.

        A session whose baseline never finished (a failed first attempt) holds
        nothing worth keeping: other inputs simply start it again."""
        meta = self.meta()
        if meta and meta.get("input_options") != input_options and \
                meta.get("steps", {}).get("baseline", {}).get("state") != "passed":
            for name in ("input.npz", "input_source.json"):
                try:
                    (self.root / name).unlink()
                except FileNotFoundError:
                    pass
            meta = {}
        if meta:
            if meta.get("model_sha256") != model_sha:
                raise UserError(
                    f"session {self.root} holds a triage of another model "
                    f"({meta.get('model_source')}, sha256 {meta.get('model_sha256', '')[:12]}); "
                    f"choose another --session"
                )
            if meta.get("input_options") != input_options:
                raise UserError(
                    f"session {self.root} was made with other inputs "
                    f"({_describe(meta.get('input_options'))}); choose another --session "
                    f"or pass the same input options"
                    + ("" if named else " (or leave out --session: each input choice gets its own directory)")
                )
            return meta
        meta = {
            "tool": "bisect-tui",
            "version": __version__,
            "created": now_iso(),
            "model_source": str(Path(model_source).resolve()),
            "model_sha256": model_sha,
            "input_options": input_options,
            "steps": {},
        }
        self.root.mkdir(parents=True, exist_ok=True)
        atomic.write_json(self.meta_path, meta)
        remember_session(self.root, meta)
        return meta

    def update_meta(self, **fields: Any) -> dict:
        meta = self.meta()
        meta.update(fields)
        atomic.write_json(self.meta_path, meta)
        return meta

    def mark_step(self, step: str, state: str, **info: Any) -> None:
        """Record a step's state (pending/running/passed/failed/skipped)."""
        meta = self.meta()
        meta.setdefault("steps", {})[step] = {"state": state, "at": now_iso(), **info}
        atomic.write_json(self.meta_path, meta)

    def step_state(self, step: str) -> Optional[str]:
        return self.meta().get("steps", {}).get(step, {}).get("state")

    # results ---------------------------------------------------------------
    def write_json(self, name: str, obj: Any) -> Path:
        p = self.root / name
        atomic.write_json(p, obj)
        return p

    def read_json(self, name: str) -> Optional[Any]:
        p = self.root / name
        if not p.exists():
            return None
        try:
            return atomic.read_json(p)
        except (OSError, ValueError):
            return None  # unreadable results are recomputed, never trusted


def _describe(opts: Optional[dict]) -> str:
    if not opts:
        return "unknown"
    if opts.get("input_file"):
        return f"file {opts['input_file']}"
    return f"seed {opts.get('seed')}, {opts.get('samples')} sample(s), shapes {opts.get('shapes') or 'static'}"


def remember_session(root: Path, meta: dict) -> None:
    """Add the session to the recent list the app's model picker shows first."""
    try:
        path = state_home() / "recent.json"
        recent = atomic.read_json(path) if path.exists() else []
        entry = {
            "session": str(Path(root).resolve()),
            "model": meta.get("model_source"),
            "at": now_iso(),
        }
        recent = [e for e in recent if e.get("session") != entry["session"]]
        recent.insert(0, entry)
        atomic.write_json(path, recent[:50])
    except (OSError, ValueError):
        pass  # the recent list is a convenience; never fail a triage over it


def recent_sessions() -> list[dict]:
    path = state_home() / "recent.json"
    try:
        recent = atomic.read_json(path) if path.exists() else []
    except (OSError, ValueError):
        return []
    return [e for e in recent if Path(e.get("session", "")).joinpath("session.json").exists()]
