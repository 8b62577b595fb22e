"""Cancellation and progress plumbing shared by the CLI and the TUI.

Threads cannot be killed, so long-running core functions poll a `CancelToken`
between units of work (one engine build, one tensor group) and raise
`Cancelled`; whatever they already wrote to the session directory stays valid.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from bisect_tui.core.errors import Cancelled


class CancelToken:
    def __init__(self, event: Optional[threading.Event] = None):
        # Textual workers expose `cancelled_event`; reuse it when given.
        self._event = event if event is not None else threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled("cancelled")


@dataclass
class Progress:
    """One progress event: `stage` says which step, `done`/`total` how far."""

    stage: str
    message: str = ""
    done: float = 0
    total: Optional[float] = None
    data: dict[str, Any] = field(default_factory=dict)


ProgressFn = Callable[[Progress], None]


def no_progress(_: Progress) -> None:
    return None
