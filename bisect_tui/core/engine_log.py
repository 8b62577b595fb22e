"""The session's engine.log: where an engine's or a reference's whole error
text goes, so the one-line error on screen can stay one line."""

from __future__ import annotations

_ENGINE_LOG: list = [None]  # the session's engine.log, set by Triage.prepare


def set_engine_log(path) -> None:
    """Where the engine's full error texts go (the one-line error points there)."""
    _ENGINE_LOG[0] = path


def log_engine_error(context: str, exc: BaseException) -> str:
    """Append the engine's whole message to the session's engine.log; returns a
    short pointer for the one-line error ("" when no session is open)."""
    path = _ENGINE_LOG[0]
    if path is None:
        return ""
    try:
        from bisect_tui.core.session import now_iso

        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"[{now_iso()}] {context}: {type(exc).__name__}\n{str(exc).rstrip()}\n\n")
    except OSError:
        return ""
    return f" (full engine message in {path.name} in the session)"
