"""Plain-text progress for the headless commands.

On a terminal: one self-overwriting bar on stderr. Elsewhere (CI logs, pipes):
one line per stage change at most every few seconds, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

from bisect_tui.core.cancel import Progress
from bisect_tui.core.escape import term


class TextProgress:
    def __init__(self, stream: Optional[TextIO] = None, enabled: bool = True, width: int = 24):
        stream = stream if stream is not None else sys.stderr  # looked up now: tests swap it
        self.stream = stream
        self.enabled = enabled
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.width = width
        self._stage = None
        self._last = 0.0
        self._line_len = 0

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        # messages carry model-supplied names: never send their control characters
        p = Progress(term(p.stage), term(p.message), p.done, p.total, p.data)
        warning = (p.data or {}).get("warning")
        if warning:  # a warning is a line of its own, never overwritten by the bar
            self.close()
            self.stream.write(f"bisect-tui: warning: {term(warning)}\n")
            self.stream.flush()
            return
        if self.tty:
            if p.total:
                frac = min(max(p.done / p.total, 0.0), 1.0)
                filled = int(frac * self.width)
                bar = "#" * filled + "." * (self.width - filled)
                text = f"[{bar}] {frac * 100:3.0f}% {p.stage}: {p.message}"
            else:
                text = f"... {p.stage}: {p.message}"
            text = text[:118]
            pad = max(self._line_len - len(text), 0)
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self._line_len = len(text)
        elif p.stage != self._stage or now - self._last > 5:
            done = f" ({p.done:g}/{p.total:g})" if p.total else ""
            self.stream.write(f"{p.stage}: {p.message}{done}\n")
            self.stream.flush()
            self._last = now
        self._stage = p.stage

    def close(self) -> None:
        if self.enabled and self.tty and self._line_len:
            self.stream.write("\r" + " " * self._line_len + "\r")
            self.stream.flush()
            self._line_len = 0
