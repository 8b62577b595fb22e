"""Reading GOLDEN and TEST dumps: `.npy`, `.npz`, folders of them, a session's baseline.

Only headers are read up front (names, dtypes, shapes), so a folder of large
dumps costs nothing until a tensor is compared; then `.npy` files are memory
mapped. Nothing is ever unpickled: an object array is refused at the header
with one line, before numpy would try. A session baseline's files are checked
against the SHA-256 in its manifest when they are read, because a changed
file must not be trusted as the golden answer.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np

from bisect_tui.core.bounded import check_declared, excerpt, parse_json
from bisect_tui.core.compare.records import Loaded, Source
from bisect_tui.core.errors import EnvironmentFault, UserError
from bisect_tui.core.escape import term

READ_BLOCK = 1 << 22
# a compressed member that inflates this much is refused: real activations compress
# by a few percent, a zip bomb by a factor of thousands
MAX_RATIO = 200
RATIO_FLOOR = 64 << 20  # below this size a high ratio costs nothing to read


BUDGET_HINT = "half the memory available now; free memory, or compare on a larger machine"


def _budget() -> int:
    """The most one tensor may claim: half the memory available now (comparing
    reads both sides and works in float64, so a larger one cannot finish)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available // 2)
    except Exception:  # no psutil reading: a size no real dump reaches refuses only forgeries
        return 64 << 30


def _refuse_objects(dtype: np.dtype, side: str, where: str) -> None:
    if dtype.hasobject:
        raise UserError(
            f"{side} {term(where)} holds a Python object array (dtype {dtype}): reading it would unpickle "
            f"arbitrary code, refused (allow_pickle=False); save plain numeric arrays with np.save"
        )


def _header(fh, side: str, where: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    except (ValueError, OSError, SyntaxError) as exc:
        raise UserError(f"{side} {term(where)} is not a readable .npy array ({term(exc)})") from None
    _refuse_objects(dtype, side, where)
    return dtype, tuple(int(d) for d in shape), fortran


def _open(path: Path, side: str):
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{side} {term(path)} does not exist") from None
    except PermissionError:
        raise EnvironmentFault(f"{side} {term(path)}: permission denied") from None
    except IsADirectoryError:
        raise UserError(f"{side} {term(path)} is a directory where a file was expected") from None


def _npy(path: Path, side: str, name: str | None = None) -> Loaded:
    with _open(path, side) as fh:
        dtype, shape, _ = _header(fh, side, str(path))
        stored = path.stat().st_size - fh.tell()
    check_declared(shape, dtype.itemsize, stored, _budget(), f"{side} {term(path)}", BUDGET_HINT)
    return Loaded(name or path.stem, path, None, dtype.str, shape)


def _npz(path: Path, side: str) -> list[Loaded]:
    out = []
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise UserError(f"{side} {term(path)} does not exist") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"{side} {term(path)} is not a readable .npz archive ({term(exc)})") from None
    budget = _budget()
    with zf:
        infos = [i for i in zf.infolist() if i.filename.endswith(".npy")]
        total = sum(i.file_size for i in infos)
        if total > 4 * budget:
            raise UserError(f"{side} {term(path)} inflates to {total / 2**30:.1f} GiB, more than this tool reads "
                            f"from one archive ({4 * budget / 2**30:.1f} GiB); split it or pass a folder of .npy files")
        for info in infos:
            key = info.filename[: -len(".npy")]
            where = f"{side} {term(path)}[{excerpt(key)}]"
            if (info.compress_type != zipfile.ZIP_STORED and info.file_size > RATIO_FLOOR
                    and info.file_size > MAX_RATIO * max(info.compress_size, 1)):
                raise UserError(f"{where} inflates {info.file_size // max(info.compress_size, 1):,} times "
                                f"(to {info.file_size / 2**20:.0f} MiB): refused as a likely zip bomb; "
                                "save it uncompressed (np.savez) if it is real")
            try:
                with zf.open(info) as fh:
                    dtype, shape, _ = _header(fh, side, f"{path}[{key}]")
                    header_len = fh.tell()
            except (zipfile.BadZipFile, OSError, NotImplementedError) as exc:
                raise UserError(f"{where} cannot be read ({excerpt(exc)})") from None
            check_declared(shape, dtype.itemsize, info.file_size - header_len, budget, where, BUDGET_HINT)
            out.append(Loaded(key, path, key, dtype.str, shape))
    if not out:
        raise UserError(f"{side} {term(path)} holds no arrays")
    return out


def _session_baseline_dir(path: Path) -> Path | None:
    """The baseline folder when `path` is a session directory or its baseline/."""
    for cand in (path / "baseline", path):
        if (cand / "manifest.json").is_file() and (cand.name == "baseline"):
            return cand
    return None


def _from_session(path: Path, base: Path, side: str) -> Source:
    try:
        manifest = parse_json((base / "manifest.json").read_text(), f"{side} {term(path)}: the baseline manifest")
        entries = manifest["tensors"]
        samples = int(manifest.get("samples", 1))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{side} {term(path)}: the session's baseline manifest is unreadable ({term(exc)})") from None
    root = base.resolve()
    tensors = []
    for e in entries:
        fname = str(e.get("file", ""))
        f = base / fname
        # Paths come from a file on disk: keep every one inside the baseline folder.
        if (not fname or "/" in fname or "\\" in fname or fname.startswith(".") or f.is_symlink()
                or f.resolve().parent != root):
            raise UserError(f"{side} {term(path)}: manifest entry {term(fname)!r} points outside the baseline folder; refused")
        if not f.is_file():
            raise UserError(f"{side} {term(path)}: baseline file {term(fname)} is missing; rerun `bisect-tui check` "
                            "to redo the baseline")
        packed = "member" in e  # a small tensor of a large model: a member of its group's .npz
        if packed and not isinstance(e.get("offset"), int):
            raise UserError(f"{side} {term(path)}: manifest entry for {term(str(e.get('tensor')))} has no valid "
                            "offset in its pack; rerun `bisect-tui check` to redo the baseline")
        tensors.append(Loaded(str(e["tensor"]), f, str(e["member"])[: -len(".npy")] if packed else None,
                              np.dtype(e["dtype"]).str, (samples, *(int(d) for d in e["shape"])),
                              sha256=str(e["sha256"]), offset=e["offset"] if packed else None))
    return Source(path, "session", tuple(tensors),
                  note=f"session baseline: {len(tensors)} tensors with a leading samples axis of {samples}; "
                       "each file used is checked against the manifest SHA-256",
                  samples_axis=True)


def load_source(path: Path, side: str) -> Source:
    """Index GOLDEN or TEST (`side` names it in messages) without reading any values."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise UserError(f"{side} {term(path)} does not exist")
    if path.is_dir():
        base = _session_baseline_dir(path)
        if base is not None:
            return _from_session(path, base, side)
        files = sorted(p for p in path.iterdir() if p.suffix in (".npy", ".npz") and p.is_file())
        if not files:
            raise UserError(f"{side} {term(path)} holds no .npy or .npz files")
        found: list[Loaded] = []
        for f in files:
            found.extend([_npy(f, side)] if f.suffix == ".npy" else _npz(f, side))
        counts: dict[str, int] = {}
        for t in found:
            counts[t.name] = counts.get(t.name, 0) + 1
        # the same name in two files: qualify the .npz members with their archive
        renamed = [Loaded(f"{t.file.stem}/{t.key}", t.file, t.key, t.dtype, t.shape)
                   if counts[t.name] > 1 and t.key is not None else t for t in found]
        names = [t.name for t in renamed]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise UserError(f"{side} {term(path)}: two files hold a tensor named {term(dup)!r}; rename one")
        return Source(path, "dir", tuple(renamed), note=f"folder, {len(renamed)} tensor(s) in {len(files)} file(s)")
    if path.suffix == ".npz":
        items = _npz(path, side)
        return Source(path, "npz", tuple(items), note=f".npz archive, {len(items)} tensor(s)")
    if path.suffix == ".npy":
        return Source(path, "npy", (_npy(path, side),), note="one .npy array")
    raise UserError(f"{side} {term(path)}: expected a .npy or .npz file, or a folder of them")


def _check_digest(t: Loaded, side: str) -> None:
    """The data bytes after the .npy header must hash to the manifest's SHA-256."""
    h = hashlib.sha256()
    with _open(t.file, side) as fh:
        _header(fh, side, str(t.file))
        while True:
            block = fh.read(READ_BLOCK)
            if not block:
                break
            h.update(block)
    if h.hexdigest() != t.sha256:
        raise UserError(
            f"{side} baseline file {term(t.file.name)} does not match the SHA-256 in its manifest "
            "(changed after the dump?): rerun `bisect-tui check` to redo the baseline"
        )


def _packed(t: Loaded, side: str) -> np.ndarray:
    """A packed session tensor: its bytes sliced from the pack, digest checked first."""
    from bisect_tui.core import baseline_pack

    try:
        st = t.file.lstat()

        def read() -> bytes:
            with _open(t.file, side) as fh:
                return fh.read()

        data = baseline_pack.read_once((str(t.file), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), read)
        digest, _, _ = baseline_pack.digest_at(data, t.offset)
    except FileNotFoundError:
        raise UserError(f"{side} {term(t.file)} does not exist") from None
    except (ValueError, OSError) as exc:
        raise UserError(f"{side} {term(t.where)} cannot be read ({term(exc)})") from None
    if digest != t.sha256:
        raise UserError(
            f"{side} baseline tensor {term(t.where)} does not match the SHA-256 in its manifest "
            "(changed after the dump?): rerun `bisect-tui check` to redo the baseline"
        )
    return baseline_pack.array_at(data, t.offset)


def read_array(t: Loaded, side: str) -> np.ndarray:
    """The values of one indexed tensor (memory mapped for a .npy)."""
    if t.offset is not None:
        return _packed(t, side)
    if t.sha256 is not None:
        _check_digest(t, side)
    try:
        if t.key is None:
            return np.load(t.file, mmap_mode="r", allow_pickle=False)
        with np.load(t.file, allow_pickle=False) as z:
            return z[t.key]
    except FileNotFoundError:
        raise UserError(f"{side} {term(t.file)} does not exist") from None
    except PermissionError:
        raise EnvironmentFault(f"{side} {term(t.file)}: permission denied") from None
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise UserError(f"{side} {term(t.where)} cannot be read ({term(exc)})") from None
