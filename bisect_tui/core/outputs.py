"""The files a user names for our results (--json, --report, --bundle).

Results are written to a temporary file and renamed over the target, so a
reader never sees half a report. Renamed over `/dev/full`, that replaced a
device file when run as root and reported success; renamed over someone's
unrelated `notes.md` it destroyed their file without a word. So a target is
checked before any work: it must be a new path or a regular file that we wrote
ourselves, recognised by its first bytes (docs/safety.md lists the marks):

* --json: a JSON object whose first 4 KiB hold `"verdict":` and `"exit_code":`;
* --report: Markdown whose first line starts with `# bisect-tui`;
* --bundle: a zip archive holding `REPORT.md`;
* --model-explorer: node data JSON whose name starts with `bisect-tui`.

Files are created with the user's umask, as any other program's output is.
"""

from __future__ import annotations

import os
import stat
import threading
import zipfile
from pathlib import Path
from typing import Optional

from bisect_tui.core.errors import UserError
from bisect_tui.core.escape import term

KINDS = ("json", "report", "bundle", "model_explorer")
HEAD = 4096

_umask_lock = threading.Lock()
_umask: Optional[int] = None


def user_umask() -> int:
    """The process umask (read once: os.umask can only be read by setting it)."""
    global _umask
    with _umask_lock:
        if _umask is None:
            current = os.umask(0o077)
            os.umask(current)
            _umask = current
        return _umask


def file_mode() -> int:
    return 0o666 & ~user_umask()


def _ours(path: Path, kind: str) -> bool:
    try:
        if kind == "bundle":
            if not zipfile.is_zipfile(path):
                return False
            with zipfile.ZipFile(path) as z:
                return "REPORT.md" in z.namelist()
        with open(path, "rb") as fh:
            head = fh.read(HEAD).decode("utf-8", "replace")
    except (OSError, zipfile.BadZipFile):
        return False
    if kind == "json":
        return head.lstrip().startswith("{") and '"verdict":' in head and '"exit_code":' in head
    if kind == "model_explorer":
        return head.lstrip().startswith("{") and '"name": "bisect-tui' in head
    return head.startswith("# bisect-tui")


def check_target(path: Optional[Path], flag: str, kind: str) -> None:
    """Refuse (exit 2, before any work) a target we must not replace."""
    if path is None:
        return
    if kind not in KINDS:
        raise ValueError(kind)
    p = Path(path)
    try:
        st = p.lstat()
    except (FileNotFoundError, NotADirectoryError):  # the latter: a file where a folder should be, below
        st = None
    except OSError as exc:
        raise UserError(f"{flag} {term(p)}: cannot be inspected ({term(exc.strerror or exc)})") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise UserError(f"{flag} {term(p)} is a symbolic link; give the real path or a new file name")
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{flag} {term(p)} is a directory; give a file name")
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{flag} {term(p)} is a device, pipe or socket, not a regular file; "
                            "give a file name")
        if not _ours(p, kind):
            what = {"json": "a bisect-tui JSON result", "report": "a bisect-tui report",
                    "bundle": "a bisect-tui bundle", "model_explorer": "bisect-tui node data"}[kind]
            raise UserError(f"{flag} {term(p)} exists and is not {what}; refusing to replace it "
                            "(remove it or give a new file name)")
        if not os.access(p, os.W_OK):
            raise UserError(f"{flag} {term(p)} exists and is not writable")
        return
    # missing folders are created when the file is written; the nearest existing
    # one must be a folder we can write in
    probe = p.parent if str(p.parent) else Path(".")
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{flag} {term(p)}: {term(probe)} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {term(p)}: the folder {term(probe)} is not writable")


def still_replaceable(path: Path) -> bool:
    """At write time: the target is absent or still a regular file (not swapped
    for a device or link since the check)."""
    try:
        return stat.S_ISREG(Path(path).lstat().st_mode)
    except FileNotFoundError:
        return True
