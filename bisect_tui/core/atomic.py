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
from typing import Any

import numpy as np


def _atomic_write(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
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


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=_json_default, allow_nan=True)


def write_json(path: Path, obj: Any) -> None:
    _atomic_write(path, (to_json(obj) + "\n").encode("utf-8"))


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    _atomic_write(path, buf.getvalue())
