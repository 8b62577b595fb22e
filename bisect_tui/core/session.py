"""The triage session directory: the single source of truth on disk.

Layout (every file written atomically; later steps only add files):

    session.json            model source + hash, input options, state of each step
    model.onnx              the prepared model (every node named) all engines read
    weights/                external data only: verified copies of the model's data files,
                            <sha256 prefix>_<name>, which model.onnx refers to (core/external_data.py)
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
from bisect_tui.core import atomic, safepath
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


_ACTIVE: list[Path] = []  # the session this process works in, for the crash log


def active_root() -> Optional[Path]:
    """The last session opened by this process (where an internal error's log goes)."""
    return _ACTIVE[-1] if _ACTIVE else None


class Session:
    def __init__(self, root: Path):
        self.root = Path(root)

    # paths -----------------------------------------------------------------
    # Every path goes through `path()`: relative names only, resolved inside the
    # root, no symlink on the way (see safepath.py).
    @property
    def meta_path(self) -> Path:
        return self.path("session.json")

    @property
    def model_path(self) -> Path:
        return self.path("model.onnx")

    @property
    def inputs_path(self) -> Path:
        return self.path("input.npz")

    @property
    def input_source_path(self) -> Path:
        return self.path("input_source.json")

    @property
    def baseline_dir(self) -> Path:
        return self.path("baseline")

    @property
    def manifest_path(self) -> Path:
        return self.path("baseline/manifest.json")

    @property
    def engines_dir(self) -> Path:
        return self.path("engines")

    @property
    def bisect_dir(self) -> Path:
        return self.path("bisect")

    @property
    def log_dir(self) -> Path:
        return self.path("log")

    def path(self, name: str) -> Path:
        return safepath.inside(self.root, name)

    def contains(self, path: Path) -> Path:
        """An absolute path read back from a session file, checked to be inside it."""
        return safepath.check_inside(self.root, path)

    # metadata --------------------------------------------------------------
    def exists(self) -> bool:
        return self.meta_path.exists()

    def meta(self) -> dict:
        """session.json, checked: a file that is not valid JSON or holds the wrong
        types is reported in one line, never trusted and never a traceback."""
        if not self.meta_path.exists():
            return {}
        try:
            with safepath.open_read(self.root, "session.json", binary=False) as fh:
                meta = json.load(fh)
        except (ValueError, UnicodeDecodeError) as exc:
            raise UserError(f"{self.meta_path} is not valid JSON ({str(exc).splitlines()[0][:120]}); "
                            "move the directory away or choose another --session") from None
        problem = _meta_problem(meta)
        if problem:
            raise UserError(f"{self.meta_path} is damaged ({problem}); "
                            "move the directory away or choose another --session")
        return meta

    def init(self, model_source: Path, model_sha: str, input_options: dict, named: bool = True) -> dict:
        """Create the session or check that an existing one is for the same model and inputs.

        A session whose baseline never finished (a failed first attempt) holds
        nothing worth keeping: other inputs simply start it again."""
        if self.root.exists() and not self.root.is_dir():
            raise UserError(f"--session {self.root} is a file, not a directory")
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
            _ACTIVE.append(self.root)
            safepath.sweep_temp(self.root)  # what a killed run left half-written
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
        _ACTIVE.append(self.root)
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
        p = self.path(name)
        atomic.write_json(p, obj)
        return p

    def read_json(self, name: str) -> Optional[Any]:
        p = self.path(name)
        if not p.exists() and not p.is_symlink():
            return None
        try:
            with safepath.open_read(self.root, name, binary=False) as fh:
                return json.load(fh)
        except safepath.UnsafePath:
            raise
        except (OSError, ValueError, UnicodeDecodeError):
            return None  # unreadable results are recomputed, never trusted


def _meta_problem(meta: Any) -> Optional[str]:
    if not isinstance(meta, dict):
        return f"expected a JSON object, found {type(meta).__name__}"
    expected = {"model_sha256": str, "model_source": str, "input_options": dict, "steps": dict,
                "options": dict, "tool": str, "version": str, "created": str}
    for key, kind in expected.items():
        if key in meta and not isinstance(meta[key], kind):
            return f"'{key}' should be {kind.__name__}, found {type(meta[key]).__name__}"
    for step, rec in (meta.get("steps") or {}).items():
        if not isinstance(rec, dict):
            return f"step '{step}' should be an object, found {type(rec).__name__}"
    return None


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
        try:
            recent = atomic.read_json(path) if path.exists() else []
        except (ValueError, UnicodeDecodeError):
            recent = []  # unreadable: started afresh
        if not isinstance(recent, list):
            recent = []  # a damaged list is replaced, not trusted
        recent = [e for e in recent if isinstance(e, dict) and isinstance(e.get("session"), str)]
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
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    if not isinstance(recent, list):
        return []
    out = []
    for e in recent:
        if not isinstance(e, dict) or not isinstance(e.get("session"), str) or not e["session"]:
            continue
        if e.get("model") is not None and not isinstance(e.get("model"), str):
            continue
        try:
            if Path(e["session"]).joinpath("session.json").exists():
                out.append(e)
        except (OSError, ValueError):
            continue
    return out
