"""TensorRT's own reason when a build fails.

Polygraphy hands TensorRT an ILogger (`backend/trt/util.py`,
`get_trt_logger`) that forwards TensorRT's ERROR and INTERNAL_ERROR messages
to `G_LOGGER.error`; when the builder then returns no plan, Polygraphy raises
the generic "Invalid Engine. Please ensure the engine was built correctly".
The reason is only in those logged lines, so a build runs inside
`captured_errors()`: Polygraphy's documented switch
`G_LOGGER.use_python_logging_system` routes its messages to Python's logging
logger "Polygraphy", where a handler keeps the ERROR lines (and Polygraphy's
console chatter stays out of the CLI's and the app's output meanwhile).
Builds running at once in one process see each other's lines: the logger is
global in Polygraphy and in TensorRT."""

from __future__ import annotations

import logging
import re
import threading
from contextlib import contextmanager

from bisect_tui.core.errors import Cancelled, EngineBuildError

_LOCK = threading.Lock()
_STATE = {"active": 0, "saved": False}
_ERROR, _CRITICAL = 40, 50  # Polygraphy's Logger.ERROR and Logger.CRITICAL
_PREFIX = re.compile(r"^\s*\[[A-Z!]\]\s*")  # Polygraphy's severity letter


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= _CRITICAL:
            return  # Polygraphy's own generic message; the exception carries it
        text = _PREFIX.sub("", record.getMessage()).strip()
        if text:
            self.lines.append(text)


@contextmanager
def captured_errors():
    """Yield a list that fills with the error lines logged while inside."""
    from polygraphy.logger import G_LOGGER

    handler = _Collect()
    log = logging.getLogger("Polygraphy")
    with _LOCK:
        if _STATE["active"] == 0:
            _STATE["saved"] = G_LOGGER.use_python_logging_system
            G_LOGGER.use_python_logging_system = True
        _STATE["active"] += 1
        log.addHandler(handler)
    try:
        yield handler.lines
    finally:
        with _LOCK:
            log.removeHandler(handler)
            _STATE["active"] -= 1
            if _STATE["active"] == 0:
                G_LOGGER.use_python_logging_system = _STATE["saved"]


def first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


class BuildFailed(Exception):
    """A build that produced no plan, with TensorRT's logged errors."""

    def __init__(self, error: BaseException, logged: list):
        super().__init__(first_line(error))
        self.error = error
        self.logged = [line for line in logged if line]

    @property
    def reason(self) -> str:
        """TensorRT's first error when it logged one, else what was raised."""
        if self.logged:
            more = len(self.logged) - 1
            return self.logged[0].splitlines()[0] + (f" (and {more} more TensorRT error(s))" if more else "")
        return first_line(self.error)

    def to_user(self, cancelled: bool) -> Exception:
        if cancelled:
            return Cancelled("cancelled: the TensorRT build was stopped")
        detail = "; ".join(self.logged) or first_line(self.error)
        return EngineBuildError(f"TensorRT could not build the engine: {self.reason}", detail)
