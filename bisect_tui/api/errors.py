"""Errors an engine raises and the exit codes they map to.

They live in the contract so that an engine needs nothing but `bisect_tui.api`;
`bisect_tui.core.errors` re-exports them for the rest of the program.

A `UserError` carries one line that is printed as-is (no traceback) and the
exit code it maps to. Everything that is the user's input being wrong raises it;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import enum
from typing import Collection


class ExitCode(enum.IntEnum):
    OK = 0  # within tolerance / nothing to find
    TOLERANCE = 1  # tolerance broken (check) or culprits found (bisect)
    USAGE = 2  # usage error or bad input
    NONDETERMINISTIC = 3  # baseline differs between two runs
    NAN_INF = 4  # NaN/Inf in the baseline
    ENVIRONMENT = 5  # the machine failed us: disk full, file too large, permission denied
    ENGINE = 6  # bisect: the engine under test cannot build or run the model at all (nothing to blame)
    INTERNAL = 70  # a bug in bisect-tui (traceback in the session's log), never a verdict
    CANCELLED = 130  # interrupted by the user; the session directory can be resumed
    OUTPUT_CLOSED = 141  # what reads our output went away (`| head`): 128 + SIGPIPE, as the shell shows it


class UserError(Exception):
    """A problem with what the user gave us, reported as one line."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE):
        super().__init__(message)
        self.code = code


class EnvironmentFault(UserError):
    """The machine, not the model, stopped the work (ENOSPC, EFBIG, EACCES...)."""

    def __init__(self, message: str):
        super().__init__(message, ExitCode.ENVIRONMENT)


class EngineBuildError(UserError):
    """The engine under test refused to build a model the baseline runs.

    Raised by engines (never made up elsewhere): with the baseline running,
    such an error is the finding a bisection starts from, not bad input."""

    kind = "build_error"
    DETAIL_MAX = 8000  # the engine's full text, bounded: a runaway log must not fill check.json

    def __init__(self, message: str, engine_message: str = "", detail: str = ""):
        super().__init__(message)
        self.engine_message = engine_message or message
        # the engine's whole message (its first line alone can stop at "...failed with X:")
        self.detail = (detail or self.engine_message)[:self.DETAIL_MAX]


class EngineRunError(EngineBuildError):
    """The engine built but failed while running on the baseline's inputs."""

    kind = "run_error"


class Cancelled(Exception):
    """Raised inside work (a search, a long build) when its cancel token is set."""


def did_you_mean(word: str, known: Collection[str]) -> str:
    """The tail every validation message shares: "; did you mean X, Y?" or nothing."""
    import difflib

    hints = difflib.get_close_matches(word, sorted(known), n=3)
    return f"; did you mean {', '.join(hints)}?" if hints else ""
