"""ONNX Runtime's pass names: learnt from the installed native library (they
changed between releases and unknown ones are ignored silently), read from
fused node names, from ORT's own log, and confirmed by a rebuild."""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import re
from pathlib import Path
from typing import Collection, Iterable, Optional

import numpy as np
import onnx


# Words ORT's optimizer names end with. Both the native-library scan and the
# node-name tag parser use them, so a name is "optimizer-like" in one place only.
_OPT_SUFFIXES = (
    "Fusion",
    "Elimination",
    "Transformer",
    "Approximation",
    "Rewrite",
    "Folding",
    "Optimizer",
)
# FusionL1/FusionL2 (level-suffixed names since ~1.20) are covered by the optional L<digit>.
_OPT_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(?:" + "|".join(_OPT_SUFFIXES) + r")(?:L[0-9])?$")
# GenerateNodeName appends `_token_<N>` when a generated name collides.
TOKEN_SUFFIX_RE = re.compile(r"_token_[0-9]+$")

# Names that are infrastructure (base classes, bare suffixes), not optimizers a
# user can disable. Kept out so they never look like valid disable targets.
_NOT_OPTIMIZERS = frozenset(
    {
        "GraphTransformer",
        "RuleBasedGraphTransformer",
        "SelectorActionTransformer",
        "GenerateRuleBasedGraphTransformer",
        "FusionL1",
        "FusionL2",
        *_OPT_SUFFIXES,
    }
)




def optimizer_tags(node_name: str, known: Collection[str]) -> list[str]:
    """Optimizer names ORT wrote into a fused node's name.

    Newer releases name a fused node `<original>/<Optimizer>/...`, e.g.
    `mm1/MatMulAddFusion/GemmTransposeFusion/` -> ["MatMulAddFusion",
    "GemmTransposeFusion"]. A component counts when it is a known optimizer or
    looks like one (the tag can differ from the disable name: the tag says
    `LayerNormFusion` while 1.32 disables it as `LayerNormFusionL1`). Names are
    kept as written (no L1/L2 stripping); a `_token_<N>` collision suffix is
    dropped. Order of first appearance, no duplicates."""
    tags: list[str] = []
    for comp in node_name.split("/"):
        comp = TOKEN_SUFFIX_RE.sub("", comp)
        if not comp or comp in tags:
            continue
        if comp in known or _OPT_NAME_RE.match(comp):
            tags.append(comp)
    return tags


def _scan_library(data: bytes, found: set[str]) -> None:
    """Collect optimizer-like identifiers from one native library image.

    Three sources, because none alone is complete: null-terminated C strings
    ending in an optimizer suffix (the name literals; a literal can be
    tail-merged by the linker, e.g. `MatMulAddFusion` lives inside
    `/MatMulAddFusion\\0`, which the backward walk still finds), rewrite-rule
    names (`EliminateIdentity`, `FuseReluClip`), and RTTI class names
    (`N11onnxruntime20ConvActivationFusionE`) for names the compiler never
    stored as a C string."""
    ident = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
    suffix_re = re.compile(
        rb"(?:Fusion(?:L[0-9])?|Elimination|Transformer|Approximation|Rewrite|Folding|Optimizer)\x00"
    )
    for m in suffix_re.finditer(data):
        end = m.end() - 1
        i = m.start()
        while i > 0 and data[i - 1] in ident and m.start() - i < 120:
            i -= 1
        found.add(data[i:end].decode("ascii"))
    for m in re.finditer(rb"\x00((?:Eliminate|Fuse)[A-Z][A-Za-z0-9_]{2,80})\x00", data):
        found.add(m.group(1).decode("ascii"))
    for m in re.finditer(rb"11onnxruntime([0-9]{1,3})([A-Za-z][A-Za-z0-9_]*)E", data):
        n = int(m.group(1))
        name = m.group(2)[:n].decode("ascii")
        if len(name) == n and _OPT_NAME_RE.match(name):
            found.add(name)


def _native_libraries() -> list[Path]:
    """The ORT native libraries shipped in the installed wheel."""
    import onnxruntime

    capi = Path(onnxruntime.__file__).parent / "capi"
    paths: list[Path] = []
    for pattern in (
        "onnxruntime_pybind11_state*.so",
        "onnxruntime_pybind11_state*.pyd",
        "libonnxruntime*.so*",
        "libonnxruntime*.dylib",
        "onnxruntime.dll",
    ):
        paths.extend(Path(p) for p in glob.glob(str(capi / pattern)))
    # provider plugins (CUDA, TensorRT) register no graph transformers of their
    # own that a user disables by name; skip them (they are hundreds of MB).
    return sorted({p for p in paths if "providers" not in p.name})


def _scan_cache_key(libs: list[Path]) -> str:
    parts = []
    for p in libs:
        try:
            st = p.stat()
            parts.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(str(p))
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def _scan_cache_path(libs: list[Path], kind: str = "optimizers") -> Path:
    from bisect_tui.core.session import state_home

    return state_home() / f"ort-{kind}-{_scan_cache_key(libs)}.json"


def _read_scan_cache(libs: list[Path], kind: str = "optimizers") -> Optional[set[str]]:
    try:
        data = json.loads(_scan_cache_path(libs, kind).read_text())
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        return None
    return set(data)


def _write_scan_cache(libs: list[Path], names: set[str], kind: str = "optimizers") -> None:
    try:
        from bisect_tui.core import atomic

        atomic.write_json(_scan_cache_path(libs, kind), sorted(names))
    except OSError:
        pass  # a cache only; the scan result is used either way


@functools.lru_cache(maxsize=1)
def known_optimizers() -> frozenset[str]:
    """Optimizer names the INSTALLED onnxruntime knows, learnt from its binary.

    This is a superset check: every name ORT accepts in `disabled_optimizers`
    appears in the library, but so may a few strings that are not (tags,
    helper class names). It is good for warning about typos and about names
    from another release; `confirm_optimizer_effect` is the real proof that
    disabling a name changes the engine. Cached in memory and on disk (keyed by
    the libraries' paths, sizes and mtimes): a scan takes a few tenths of a second."""
    libs = _native_libraries()
    found = _read_scan_cache(libs)
    if found is None:
        found = set()
        for path in libs:
            try:
                data = path.read_bytes()
            except OSError:
                continue
            _scan_library(data, found)
        _write_scan_cache(libs, found)
    if "_RuleBasedTransformer" in found:
        # the rule containers are named "Level<N>_RuleBasedTransformer" at runtime
        found.update(f"Level{k}_RuleBasedTransformer" for k in (1, 2, 3))
    return frozenset(
        n for n in found if n and not n.startswith("_") and n not in _NOT_OPTIMIZERS
    )


@functools.lru_cache(maxsize=1)
def known_config_keys() -> frozenset[str]:
    """Session config keys the INSTALLED onnxruntime knows, read from its binary.

    ORT accepts any key in `add_session_config_entry` and ignores the ones it
    does not know, so a misspelt key silently gives a PASS. The key literals
    (`session.*`, `optimization.*`, `mlas.*`, `ep.*`...) sit as C strings in the
    native library; a key ending in "." is a prefix family (`ep.cuda.`). Cached
    on disk like the optimizer names (the scan costs most of a second)."""
    libs = _native_libraries()
    cached = _read_scan_cache(libs, "config-keys")
    if cached is not None:
        return frozenset(cached)
    rx = re.compile(rb"(?<=\x00)((?:session|optimization|mlas|ep|kernel|memory|arena)\.[a-z0-9_.]{2,160})(?=\x00)")
    found: set[str] = set()
    for path in libs:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        found.update(m.group(1).decode("ascii") for m in rx.finditer(data))
    if found:
        _write_scan_cache(libs, found, "config-keys")
    return frozenset(found)


def unknown_config_keys(keys: Iterable[str]) -> list[str]:
    """Keys the installed ORT does not know (empty when the scan found nothing: then it cannot tell)."""
    known = known_config_keys()
    if not known:
        return []
    prefixes = tuple(k for k in known if k.endswith("."))
    return [k for k in keys if k not in known and not k.startswith(prefixes)]


def unknown_optimizers(names: Iterable[str]) -> list[str]:
    """Names the installed ORT does not know (it would silently ignore them)."""
    known = known_optimizers()
    return [n for n in names if n not in known]


def versions() -> dict[str, str]:
    """Versions recorded in every session so a report says what produced it."""
    import onnxruntime

    return {
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "providers": ",".join(onnxruntime.get_available_providers()),
    }


_TAG_LEVEL_SUFFIX = re.compile(r"L\d")


def pass_candidates(tags, known) -> list[str]:
    """Node-name tags -> the names ORT accepts for disabling them: the tag itself
    or its level variants (the tag `LayerNormFusion` is disabled as
    `LayerNormFusionL1` on 1.32); a tag it does not know is kept as it is."""
    out: list[str] = []
    for tag in tags:
        matches = sorted(k for k in known if k == tag or (k.startswith(tag) and _TAG_LEVEL_SUFFIX.fullmatch(k[len(tag):])))
        out.extend(matches or [tag])
    return list(dict.fromkeys(out))


def pass_log_note(found: str, logged) -> Optional[str]:
    """Rewrite rules are logged under their container only: say so when the
    pass found is not in ORT's log but such a container is."""
    rules = [n for n in logged if n.endswith("RuleBasedTransformer")]
    if found in logged or not rules:
        return None
    return "not listed by name; a rewrite rule runs inside " + ", ".join(rules) + ", which the log lists"
