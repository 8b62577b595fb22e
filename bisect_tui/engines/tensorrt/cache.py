"""Built engines cached in the session directory, reused only after their
digest checks out.

An engine build takes seconds to minutes and a bisection asks for dozens, and
a resumed session asks for the same ones again. The key covers everything the
plan depends on: the model file's digest, the TensorRT options, the switch
(marked tensors, FP32 keep-set), and the TensorRT/Polygraphy versions and the
GPU model with its compute capability (a plan only runs on the TensorRT build
and GPU it was made for: `engine_versions`). A plan that still fails to
deserialize is dropped (`EngineCache.drop`) and rebuilt.

Each record also keeps what the build learnt (the FP32 pin plan, marks the
network lacked), so a cache hit, or another process of the same session,
reports the same as the build that made it. One TensorRT timing cache per
session and GPU (`timing_cache_path`) lets every build of a search reuse the
tactic timings instead of timing again (and choosing differently).

Layout: `<dir>/<key>.plan` (the serialized engine, raw bytes) and
`<dir>/<key>.json` (its SHA-256 and what it was built from). No pickle; a plan
whose bytes do not match the recorded digest is ignored and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Optional

from bisect_tui.core import atomic

_KEY_RE = re.compile(r"^[0-9a-f]{24}$")


@dataclass(frozen=True)
class CacheKeyParts:
    model_digest: str
    options: dict
    marked: tuple = ()
    keep_fp32: tuple = ()
    disabled: tuple = ()
    observe: str = "outputs"  # how marked tensors are observed: outputs | debug
    versions: tuple = ()  # (("polygraphy", "0.53.6"), ("tensorrt", "10.9"), ("gpu", "..."))

    def blob(self) -> bytes:
        d = {
            "model": self.model_digest,
            "options": self.options,
            "marked": sorted(set(self.marked)),
            "keep_fp32": sorted(set(self.keep_fp32)),
            "disabled": sorted(set(self.disabled)),
            "observe": self.observe,
            "versions": sorted([list(v) for v in self.versions]),
        }
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    def key(self) -> str:
        return hashlib.sha256(self.blob()).hexdigest()[:24]


def cache_key(
    model_digest: str,
    options: dict,
    marked: Collection[str] = (),
    keep_fp32: Collection[str] = (),
    disabled: Collection[str] = (),
    observe: str = "outputs",
    versions: Optional[dict] = None,
) -> str:
    return CacheKeyParts(
        model_digest, dict(options), tuple(marked), tuple(keep_fp32), tuple(disabled), observe,
        tuple(sorted((versions or {}).items())),
    ).key()


def engine_versions(tensorrt: str, polygraphy: str, gpu: str) -> dict:
    """The version part of a key: what a plan is bound to besides its inputs."""
    return {"tensorrt": str(tensorrt), "polygraphy": str(polygraphy), "gpu": str(gpu)}


def timing_cache_path(root: Path, versions: dict) -> Path:
    """The session's timing cache for one TensorRT build and GPU (Polygraphy
    loads it with ignore_mismatch=False, so another GPU's cache must not be it)."""
    tag = {k: versions.get(k, "") for k in ("tensorrt", "gpu")}
    digest = hashlib.sha256(json.dumps(tag, sort_keys=True).encode()).hexdigest()[:16]
    return Path(root) / f"timing_{digest}.cache"


class EngineCache:
    """A directory of serialized engines keyed by `cache_key`."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _paths(self, key: str) -> tuple[Path, Path]:
        if not _KEY_RE.match(key):
            raise ValueError(f"not a cache key: {key!r}")
        root = self.root.resolve()
        return root / f"{key}.plan", root / f"{key}.json"

    def get(self, key: str) -> Optional[bytes]:
        """The plan bytes if present and their digest matches, else None."""
        plan, meta = self._paths(key)
        for p in (plan, meta):
            if not p.exists() or p.is_symlink() or not p.is_file():
                return None
        try:
            info = json.loads(meta.read_text())
            data = plan.read_bytes()
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict) or info.get("key") != key:
            return None
        if info.get("size") != len(data) or info.get("sha256") != hashlib.sha256(data).hexdigest():
            return None
        return data

    def put(self, key: str, data: bytes, info: Optional[dict[str, Any]] = None) -> Path:
        plan, meta = self._paths(key)
        self.root.mkdir(parents=True, exist_ok=True)
        if self.root.is_symlink():
            raise ValueError(f"engine cache directory is a symlink: {self.root}")
        for p in (plan, meta):
            if p.is_symlink():
                os.unlink(p)
        atomic.write_bytes(plan, data)
        record = dict(info or {})
        record.update({"key": key, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        atomic.write_json(meta, record)
        return plan

    def info(self, key: str) -> dict:
        """The record written with a plan ({} when absent or unreadable)."""
        _, meta = self._paths(key)
        if not meta.is_file() or meta.is_symlink():
            return {}
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) and info.get("key") == key else {}

    def drop(self, key: str) -> None:
        """Forget a plan (one that no longer deserializes, e.g. from another GPU)."""
        for p in self._paths(key):
            if p.is_symlink() or p.is_file():
                p.unlink()

    def plan_for_keep(self, keep) -> dict:
        """The precision plan a build with exactly this keep-set recorded, {} if none."""
        want = sorted(set(keep))
        for key in self.keys():
            info = self.info(key)
            plan = info.get("precision_plan")
            if info.get("keep_fp32") == want and isinstance(plan, dict) and plan.get("pins"):
                return plan
        return {}

    def keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.json") if _KEY_RE.match(p.stem))
