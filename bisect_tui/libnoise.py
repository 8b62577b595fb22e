"""Third-party warnings and log records go to the session's log, not the terminal.

A new user read numpy's `RuntimeWarning: overflow encountered in exp` (from a
reference evaluator) between the verdict lines and took it for bisect-tui's own
finding. What a library says is kept whole in `<session>/log/libraries.log`, and
the terminal gets one line saying how many there were and where they are. With
no session open (an error before one), they are printed as Python would have.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Optional

LOG_NAME = "libraries.log"


class _Collect(logging.Handler):
    """logging's last-resort handler (a library logging with no handler of its own)."""

    def __init__(self, sink: "LibraryNoise"):
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.add(f"{record.levelname} {record.name}: {record.getMessage()}")
        except Exception:  # a record that cannot format itself is not worth a crash
            pass


class LibraryNoise:
    """Installed around one command: `start()`, then `finish(session_root)`."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._saved: Optional[tuple] = None

    def add(self, text: str) -> None:
        self.lines.append(text.rstrip())

    def _show(self, message, category, filename, lineno, file=None, line=None) -> None:
        self.add(f"{category.__name__}: {message} ({filename}:{lineno})")

    def start(self) -> "LibraryNoise":
        self._saved = (warnings.showwarning, logging.lastResort)
        warnings.showwarning = self._show
        logging.lastResort = _Collect(self)
        return self

    def stop(self) -> None:
        if self._saved is not None:
            warnings.showwarning, logging.lastResort = self._saved
            self._saved = None

    def finish(self, root: Optional[Path]) -> Optional[str]:
        """Stop collecting; write what was said into the session's log and return
        the one line for the terminal (None when nothing was said)."""
        self.stop()
        if not self.lines:
            return None
        lines, self.lines = self.lines, []
        if root is not None:
            try:
                from bisect_tui.core.session import Session, now_iso

                folder = Session(Path(root)).log_dir
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / LOG_NAME
                with open(path, "a", encoding="utf-8") as fh:
                    fh.write(f"[{now_iso()}] {' '.join(sys.argv[1:3])}\n" + "\n".join(lines) + "\n\n")
                first = lines[0].split(" (")[0][:100]
                return (f"bisect-tui: {len(lines)} warning(s) from the libraries it ran (first: {first}); "
                        f"all in {path}")
            except OSError:
                pass
        return "\n".join(lines)
