"""Paths inside a session directory that cannot lead outside it.

Session directories travel: they are zipped, attached to bug reports and
edited by hand. A planted symlink (`bisect/steps.jsonl -> ~/.bashrc`) or a
manifest entry like `../../etc/passwd` must not make the tool write or read
anything outside the directory the user named. Every path the tool opens
inside a session goes through here: relative names only, resolved and checked
to stay under the root, no symlink followed on the way, and files opened with
`O_NOFOLLOW` so a link swapped in after the check still fails.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path, PurePosixPath
from typing import Optional, Union

from bisect_tui.core.errors import UserError

PathLike = Union[str, os.PathLike]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafePath(UserError):
    """A path inside a session that would leave it or follow a link."""


def is_plain_name(name: object) -> bool:
    """A single file name: no directory part, not `.`/`..`, no NUL, not empty."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        return False
    return "/" not in name and "\\" not in name and "\x00" not in name


def is_relative_name(rel: object) -> bool:
    """A relative path of plain names (`baseline/x.npy`), never absolute or with `..`."""
    if not isinstance(rel, str) or not rel or rel.startswith(("/", "\\")) or "\x00" in rel:
        return False
    parts = PurePosixPath(rel).parts
    return bool(parts) and all(p not in ("..", ".") and "\\" not in p for p in parts)


def _real_root(root: PathLike) -> Path:
    return Path(os.path.realpath(root))


def inside(root: PathLike, rel: PathLike) -> Path:
    """`root/rel`, refusing `..`, absolute names and symlinks between root and target.

    The root itself may be a link (the user chose it); nothing under it may be.
    Missing components are fine: they are about to be created."""
    rel_s = os.fspath(rel)
    if not is_relative_name(rel_s):
        raise UnsafePath(f"refusing session path {rel_s!r}: only relative names inside the session are used")
    base = Path(root)
    cur = base
    for part in PurePosixPath(rel_s).parts:
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            break
        except NotADirectoryError:
            raise UnsafePath(f"session path {cur} runs through a file that is not a directory") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(
                f"{cur} is a symbolic link; bisect-tui never follows links inside a session "
                "(remove it, or start a fresh --session)")
    target = base / rel_s
    real = Path(os.path.realpath(target))
    if not _is_under(real, _real_root(base)):
        raise UnsafePath(f"session path {target} resolves outside the session directory {base}")
    return target


def check_inside(root: PathLike, path: PathLike) -> Path:
    """An absolute path read back from a session file (e.g. a saved engine graph),
    accepted only when it lies inside the session root without links."""
    p = Path(path)
    real_root = _real_root(root)
    try:
        rel = Path(os.path.abspath(p)).relative_to(Path(os.path.abspath(root)))
    except ValueError:
        try:
            rel = Path(os.path.abspath(p)).relative_to(real_root)
        except ValueError:
            raise UnsafePath(f"session file names {p}, which is outside the session directory {root}") from None
    return inside(root, rel.as_posix())


def _is_under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def open_nofollow(path: PathLike, flags: int, mode: int = 0o644) -> int:
    """os.open with O_NOFOLLOW: a link in the last component fails with one line."""
    try:
        return os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise UnsafePath(
                f"{path} is a symbolic link; bisect-tui never follows links inside a session "
                "(remove it, or start a fresh --session)") from None
        raise


def open_append(root: PathLike, rel: PathLike):
    """A text handle appending to `root/rel` (created if missing), never through a link."""
    target = inside(root, rel)
    fd = open_nofollow(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding="utf-8")


def open_read(root: PathLike, rel: PathLike, binary: bool = True):
    target = inside(root, rel)
    fd = open_nofollow(target, os.O_RDONLY)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePath(f"{target} is not a regular file")
    return os.fdopen(fd, "rb" if binary else "r", **({} if binary else {"encoding": "utf-8"}))


def read_json(root: PathLike, rel: PathLike):
    """JSON from `root/rel`, read without following links."""
    import json

    with open_read(root, rel, binary=False) as fh:
        return json.load(fh)


def regular_file(path: PathLike) -> bool:
    """True for an existing regular file that is not a link (lstat, no following)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


# temp files -----------------------------------------------------------------
TMP_DIR = "tmp"
_saved_tempdir: list[Optional[str]] = []


def use_session_temp(root: PathLike) -> Path:
    """Make every temp file of this process (ours, ORT's build folders) live in
    `<session>/tmp`, so an interruption leaves nothing in /tmp and a rerun can
    sweep what a SIGKILL left behind."""
    tmp = inside(root, TMP_DIR)
    tmp.mkdir(parents=True, exist_ok=True)
    if not _saved_tempdir:
        _saved_tempdir.append(tempfile.tempdir)
    tempfile.tempdir = str(tmp)
    return tmp


def release_session_temp(root: Optional[PathLike] = None) -> None:
    """Restore the process temp folder and remove the session's temp files."""
    if _saved_tempdir:
        tempfile.tempdir = _saved_tempdir.pop()
    if root is not None:
        sweep_temp(root)


def sweep_temp(root: PathLike) -> int:
    """Remove what an interrupted run left: `<session>/tmp` and half-written
    `.name.*.tmp` / `.tmp_*.npy` / `.tmp_*.npz` files of atomic writes. Returns how many."""
    removed = 0
    base = Path(root)
    tmp = base / TMP_DIR
    if tmp.is_dir() and not tmp.is_symlink():
        for child in tmp.iterdir():
            try:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink()
                removed += 1
            except OSError:
                pass
    if not base.is_dir() or base.is_symlink():
        return removed
    # every folder of the session (an atomic write may be cut anywhere: a culprit's
    # subgraph, an engine folder), never through a link
    for folder, dirs, files in os.walk(base, followlinks=False):
        if Path(folder) == base:
            dirs[:] = [d for d in dirs if d != TMP_DIR]
        for n in files:
            if (n.startswith(".") and n.endswith(".tmp")) or (n.startswith(".tmp_") and n.endswith((".npy", ".npz"))):
                child = Path(folder) / n
                try:
                    child.unlink()  # a file, or a link itself (never what it points to)
                    removed += 1
                except OSError:
                    pass
    return removed
