"""Where a TensorRT build finds its session: the engine cache, the timing
cache and the shapes the triage runs.

The search builds marked engines without a workdir and isolates subgraphs
written inside the session, so the session is found from the model's place
(the nearest folder above it holding `session.json`, a real file, at most four
levels up)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import numpy as np


def session_root(model_path: Path) -> Optional[Path]:
    here = Path(model_path).resolve().parent
    for d in [here, *list(here.parents)[:4]]:
        meta = d / "session.json"
        if meta.is_file() and not meta.is_symlink():
            return d
    return None


def session_cache_dir(model_path: Path, workdir: Optional[Path] = None) -> Optional[Path]:
    """Where built engines are cached: the session's `engines/trt_engines`;
    outside a session the workdir's `trt_engines`; with neither, None."""
    root = session_root(model_path)
    if root is not None:
        return root / "engines" / "trt_engines"
    return Path(workdir) / "trt_engines" if workdir is not None else None


def session_input_shapes(model_path: Path) -> dict:
    """Shapes of the session's saved inputs (`input.npz`, arrays stored as
    `(samples, *shape)`), read from the .npy headers only: nothing is loaded,
    nothing unpickled. {} outside a session or when the file is unreadable."""
    import zipfile

    root = session_root(model_path)
    if root is None:
        return {}
    path = root / "input.npz"
    if not path.is_file() or path.is_symlink():
        return {}
    shapes = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version == (1, 0):
                        shape, _, _ = np.lib.format.read_array_header_1_0(fh)
                    else:
                        shape, _, _ = np.lib.format.read_array_header_2_0(fh)
                if len(shape) >= 1:
                    shapes[info.filename[:-4]] = [int(d) for d in shape[1:]]
    except (OSError, ValueError, zipfile.BadZipFile):
        return {}
    return shapes


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
