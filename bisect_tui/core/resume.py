"""Reopening a session directory: the options it was made with are in session.json."""

from __future__ import annotations

from pathlib import Path

from bisect_tui.core.errors import UserError


def options_from_session(root: Path):
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
    problem = _options_problem(opts)
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


def _options_problem(opts) -> str | None:
    """What `check` would have refused on its command line, found in a hand-edited session.json."""
    from bisect_tui.api import LEVELS

    c = opts.config
    if c.level not in LEVELS:
        return f"level {c.level!r} is not one of {', '.join(LEVELS)}"
    if c.precision not in ("fp32", "fp16"):
        return f"precision {c.precision!r} is not fp32 or fp16"
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in c.config_entries):
        return "config entries must be strings"
    if not all(isinstance(n, str) for n in c.disabled_passes):
        return "disabled optimizers must be names"
    if not 1 <= opts.samples <= 10_000:
        return f"samples {opts.samples} is out of range"
    if opts.seed < 0:
        return f"seed {opts.seed} is negative"
    if opts.topk is not None and (not isinstance(opts.topk, int) or opts.topk < 1):
        return f"topk {opts.topk!r} must be an integer >= 1"
    if not isinstance(opts.engine, str):
        return f"engine {opts.engine!r} is not a name"
    from bisect_tui.engines.registry import get_engine

    try:
        get_engine(opts.engine)
    except UserError as exc:
        return str(exc)
    if opts.max_memory < 0:
        return f"max_memory {opts.max_memory} is negative"
    for name, dims in opts.shapes.items():
        if not all(isinstance(d, int) and d >= 0 for d in dims):
            return f"shape of {name!r} must be non-negative integers"
    return None
