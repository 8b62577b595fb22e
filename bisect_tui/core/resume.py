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
    meta = session.meta()
    if not meta:
        raise UserError(f"{root} is not a bisect-tui session directory (no session.json)")
    opts = meta.get("options")
    if not opts:
        raise UserError(f"session {root} was interrupted before its options were saved; start it again with `check`")
    opts = TriageOptions.from_dict({**opts, "session_dir": str(Path(root).resolve())})
    if not Path(opts.model).exists():
        prepared = session.model_path
        if not prepared.exists():
            raise UserError(f"the session's model {opts.model} is gone and {prepared} is missing")
        raise UserError(
            f"the session's model {opts.model} is gone; the prepared copy is at {prepared} "
            "(pass it to `check --session` to continue)"
        )
    return opts
