"""The baseline manifest checked before anything in it is trusted.

A saved dump is reused only tensor by tensor: each entry's file must be a
plain name inside the baseline folder (no `..`, no absolute path, no link) and
its data must have the SHA-256, shape and dtype written with it, whether it
is a file of its own or a member of a pack.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

import numpy as np

from bisect_tui.core import baseline_pack, safepath
from bisect_tui.core.session import Session


def npy_data_sha256(path: Path, chunk: int = 1 << 22) -> tuple[str, tuple, str]:
    """SHA-256 of an .npy file's data (what the manifest records), its shape and dtype."""
    with safepath.open_read(path.parent, path.name) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        h = hashlib.sha256()
        while True:
            b = fh.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest(), tuple(shape), np.dtype(dtype).name


def _read_pack(outdir: Path, name: str, packs: Optional[dict]) -> bytes:
    if packs is not None and name in packs:
        return packs[name]
    with safepath.open_read(outdir, name) as fh:
        data = fh.read()
    if packs is not None:
        packs.clear()  # one pack at a time: entries come grouped by pack
        packs[name] = data
    return data


def entry_problem(outdir: Path, e: object, samples: Optional[int] = None,
                  packs: Optional[dict] = None) -> Optional[str]:
    """Why a manifest entry cannot be trusted (None when its file matches its digest).

    Checked before any tensor is reused: the file name is a plain name inside
    the baseline folder (no `..`, no absolute path, no link), and the data's
    SHA-256, shape and dtype are the ones written with it. A packed tensor's
    bytes are checked the same way inside its pack (`packs` keeps the last pack
    read, so a pack of thousands of members is read once)."""
    try:
        if not isinstance(e, dict):
            return "not an object"
        name = e["file"]
        if not safepath.is_plain_name(name):
            return f"file name {name!r} is not a plain name in the baseline folder"
        if baseline_pack.is_packed(e) and not safepath.is_plain_name(e["member"]):
            return f"member name {e['member']!r} is not a plain name"
        p = outdir / name
        if not safepath.regular_file(p):
            return "file missing" if not os.path.lexists(p) else "not a regular file (a link?)"
        if baseline_pack.is_packed(e):
            digest, shape, dtype = baseline_pack.digest_at(_read_pack(outdir, name, packs), e["offset"])
        else:
            digest, shape, dtype = npy_data_sha256(p)
        want = tuple([samples, *e["shape"]]) if samples is not None else shape
        if shape != want or dtype != e["dtype"]:
            return f"holds {dtype} {list(shape)}, the manifest says {e['dtype']} {list(want)}"
        if digest != e["sha256"]:
            return "contents differ from the SHA-256 written with it"
        return None
    except safepath.UnsafePath as exc:
        return str(exc)
    except (KeyError, TypeError, ValueError, OSError) as exc:
        return f"unreadable ({type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''})"


def check_manifest(session: Session, m: object) -> tuple[Optional[dict], list[dict], list[dict]]:
    """(manifest or None, trusted entries, bad entries with reasons)."""
    if not isinstance(m, dict) or not isinstance(m.get("tensors"), list):
        return None, [], []
    samples = m.get("samples") if isinstance(m.get("samples"), int) else None
    good, bad = [], []
    packs: dict = {}
    for e in m["tensors"]:
        why = entry_problem(session.baseline_dir, e, samples, packs)
        if why is None:
            good.append(e)
        else:
            bad.append({"tensor": e.get("tensor") if isinstance(e, dict) else None, "why": why})
    return m, good, bad


def load_manifest(session: Session) -> Optional[dict]:
    """The finished baseline's manifest when every tensor file matches its digest."""
    m, good, bad = check_manifest(session, session.read_json("baseline/manifest.json"))
    if m is None or bad:
        return None
    return m
