"""The search's trials on record: this run's steps, and earlier runs' from disk.

Every trial the search judges is appended to `bisect/steps.jsonl` with a
SHA-256 of itself, which is how a search resumes: a rerun asks for the same
trials, finds their records and replays them without building. A record whose
digest does not match (edited by hand, damaged) is not trusted: it is
recomputed, and the count is reported. A torn last line (an interrupted write)
is skipped. `MemoryStore` keeps the same records without a file, for a search
driven without a session (tests/test_strategy.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Iterable, Optional

from bisect_tui.core import atomic, safepath
from bisect_tui.core.bisect.records import Step
from bisect_tui.core.session import now_iso

STEPS_FILE = "bisect/steps.jsonl"


def record_digest(rec: dict) -> str:
    """SHA-256 of a step record (without its own digest), written with it."""
    body = {k: v for k, v in rec.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


class MemoryStore:
    """Steps of this run (in the order judged) and the records a rerun may reuse."""

    def __init__(self, records: Iterable[dict] = ()):
        self.steps: list[Step] = []
        self.records: dict[str, dict] = {}  # step key -> its latest record, all runs
        self.untrusted = 0
        for rec in records:
            self.records[rec["key"]] = rec

    # --- this run -----------------------------------------------------------------
    def done(self, key: str) -> Optional[Step]:
        """The step of this run with `key` (a trial asked twice is judged once)."""
        return next((st for st in self.steps if st.key == key), None)

    def add(self, step: Step) -> Step:
        self.steps.append(step)
        return step

    def replace(self, old: Step, new: Step) -> Step:
        """A step of this run learnt more (its optimized graph, read again)."""
        self.steps = [new if st is old else st for st in self.steps]
        return new

    @property
    def next_n(self) -> int:
        return len(self.steps) + 1

    # --- all runs -------------------------------------------------------------------
    def recorded(self, key: str) -> Optional[dict]:
        return self.records.get(key)

    def remember(self, key: str, rec: dict) -> None:
        """Known for this run's reuse, not written (another search's verdict adopted)."""
        self.records[key] = rec

    def save(self, rec: dict, **extra) -> None:
        """Record a trial: reused by this run and, on disk, by the next (with the
        time written: the later line for a key wins on resume)."""
        self.records[rec["key"]] = rec
        self._write({**rec, "at": now_iso(), **extra})

    def _write(self, rec: dict) -> None:
        pass

    def trusted_file(self, path: Optional[str]) -> Optional[str]:
        return path if path and Path(path).is_file() else None

    @property
    def count(self) -> int:
        """Distinct trials on record, all runs (the result's engine_builds_all_runs)."""
        return len(self.records)


class StepStore(MemoryStore):
    """`bisect/steps.jsonl` of a session: read once, appended to atomically line by line."""

    def __init__(self, session, notify: Callable[[str], None] = lambda text: None):
        super().__init__()
        self.session = session
        self._load(notify)

    @property
    def path(self) -> Path:
        return self.session.root / STEPS_FILE

    def _load(self, notify: Callable[[str], None]) -> None:
        if not self.path.exists() and not self.path.is_symlink():
            return
        with safepath.open_read(self.session.root, STEPS_FILE, binary=False) as fh:
            text = fh.read()
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn last line from an interrupted write
            if not isinstance(rec, dict) or not isinstance(rec.get("key"), str):
                continue
            if rec.get("digest") != record_digest(rec):
                self.untrusted += 1
                continue
            self.records[rec["key"]] = rec
        if self.untrusted:
            notify(f"{self.untrusted} saved step(s) failed their digest check and will be recomputed")

    def _write(self, rec: dict) -> None:
        rec = {k: v for k, v in rec.items() if k != "digest"}
        rec["digest"] = record_digest(rec)
        line = atomic.to_json(rec, compact=True) + "\n"
        with safepath.open_append(self.session.root, STEPS_FILE) as fh:
            fh.write(line)
            fh.flush()

    def trusted_file(self, path: Optional[str]) -> Optional[str]:
        """A path read back from a session file, kept only if it is a regular file
        inside the session (never a link, never outside)."""
        from bisect_tui.core.errors import UserError

        if not path:
            return None
        try:
            p = self.session.contains(Path(path))
        except UserError:
            return None
        return str(p) if safepath.regular_file(p) else None

