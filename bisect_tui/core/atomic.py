"""Atomic writes: a file in the session directory is either complete or absent.

Each write goes to a temporary file in the same directory, is flushed and
fsync'ed, then renamed over the target, so a dropped SSH connection or a
Ctrl-C never leaves a half-written tensor or JSON file behind.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from bisect_tui.core import outputs
from bisect_tui.core.errors import UserError
from bisect_tui.core.escape import term


def _atomic_write(path: Path, data: bytes) -> None:
    # Safe against a link planted at `path`: mkstemp creates with O_EXCL (never
    # through a link) and os.replace swaps the link itself for the file rather
    # than writing where it points. Folders are checked by the caller
    # (Session.path / safepath.inside).
    # A device, pipe or folder at `path` is never replaced: renamed over
    # /dev/full, a report once replaced the device and the write "succeeded".
    # Outputs the user names are checked before any work (core/outputs.py);
    # this is the last guard for every write.
    path = Path(path)
    if not outputs.still_replaceable(path):
        raise UserError(f"{term(path)} is not a regular file; refusing to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, outputs.file_mode())  # mkstemp's 0600, widened to what the umask allows
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_bytes(path: Path, data: bytes) -> None:
    _atomic_write(path, data)


def write_text(path: Path, text: str) -> None:
    _atomic_write(path, text.encode("utf-8"))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def to_json(obj: Any, compact: bool = False) -> str:
    """`compact` for large machine-read files (manifests, fused-node maps):
    without indent json uses its C encoder, several times faster."""
    if compact:
        return json.dumps(obj, separators=(",", ":"), default=_json_default, allow_nan=True)
    return json.dumps(obj, indent=2, default=_json_default, allow_nan=True)


# Indented JSON goes through json's pure-Python encoder: on a 5,000-node model
# the session's results took about a second to write. Files up to this size stay
# indented for people reading them; larger ones are written compact.
INDENT_MAX_CHARS = 32 << 10


def write_json(path: Path, obj: Any, compact: Optional[bool] = None) -> None:
    """`compact=None`: indented when the result is small, compact when large."""
    if compact is None:
        text = to_json(obj, compact=True)
        if len(text) <= INDENT_MAX_CHARS:
            text = to_json(obj)
    else:
        text = to_json(obj, compact)
    _atomic_write(path, (text + "\n").encode("utf-8"))


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz that `np.load` reads back key for key.

    Written member by member rather than with `np.savez(**arrays)`: input names
    come from the model, and names like `file` or `allow_pickle` would collide
    with savez's own keywords (dropped, or a TypeError). No pickles, ever."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, arr in arrays.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(arr), allow_pickle=False)
    return buf.getvalue()


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    _atomic_write(path, npz_bytes(arrays))
