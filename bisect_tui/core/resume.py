"""Reopening a session directory: the options it was made with are in session.json.

A hand-edited or foreign session.json is checked the way `check` checks its
command line: the engine named must exist and declare the level and precision
(`Capabilities`). The caller hands in the engine resolver (the registry's
`get_engine`): the core does not choose engines."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from bisect_tui.core.errors import UserError


def options_from_session(root: Path, resolve: Optional[Callable] = None):
    """The options of the session at `root`. `resolve(name)` -> the engine;
    without it the engine's own checks wait for the first build."""
    from bisect_tui.core.pipeline import TriageOptions
    from bisect_tui.core.session import Session

    session = Session(Path(root))
    if not Path(root).exists():
        raise UserError(f"session directory not found: {root}")
    if not Path(root).is_dir():
        raise UserError(f"{root} is a file, not a session directory")
    meta = session.meta()
    if not meta:
        raise UserError(f"{root} is not a bisect-tui session directory (no session.json)")
    opts = meta.get("options")
    if not opts:
        raise UserError(f"session {root} was interrupted before its options were saved; start it again with `check`")
    try:
        opts = TriageOptions.from_dict({**opts, "session_dir": str(Path(root).resolve())})
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"{session.meta_path} holds options bisect-tui cannot read "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}); "
                        "start the triage again with `check`") from None
    problem = _options_problem(opts, resolve)
    if problem:
        raise UserError(f"{session.meta_path} holds invalid options ({problem}); start the triage again with `check`")
    if not Path(opts.model).exists():
        prepared = session.model_path
        if not prepared.exists():
            raise UserError(f"the session's model {opts.model} is gone and {prepared} is missing")
        raise UserError(
            f"the session's model {opts.model} is gone; the prepared copy is at {prepared} "
            "(pass it to `check --session` to continue)"
        )
    return opts


def _options_problem(opts, resolve: Optional[Callable] = None) -> str | None:
    """What `check` would have refused on its command line, found in a hand-edited session.json."""
    c = opts.config
    if not isinstance(c.level, str) or not isinstance(c.precision, str):
        return "level and precision must be names"
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in c.config_entries):
        return "config entries must be strings"
    if not all(isinstance(n, str) for n in c.disabled_passes):
        return "disabled passes must be names"
    if not 1 <= opts.samples <= 10_000:
        return f"samples {opts.samples} is out of range"
    if opts.seed < 0:
        return f"seed {opts.seed} is negative"
    if opts.topk is not None and (not isinstance(opts.topk, int) or opts.topk < 1):
        return f"topk {opts.topk!r} must be an integer >= 1"
    if not isinstance(opts.engine, str):
        return f"engine {opts.engine!r} is not a name"
    if resolve is not None:
        try:
            engine = resolve(opts.engine)
        except UserError as exc:
            return str(exc)
        problem = engine.capabilities.problem(c.level, c.precision)
        if problem:
            return f"{problem} for {engine.label or opts.engine}"
    if opts.max_memory < 0:
        return f"max_memory {opts.max_memory} is negative"
    for name, dims in opts.shapes.items():
        if not all(isinstance(d, int) and d >= 0 for d in dims):
            return f"shape of {name!r} must be non-negative integers"
    return None
