"""The ONNX node names a TensorRT engine layer's name is made of.

Layer names carry the ONNX node names they merge: `A + B` (fusion),
`PWN(A, PWN(B))` (pointwise fusion), `{ForeignNode[first...last]}` (a Myelin
region from the first to the last node in graph order), `name_myl0_3` (Myelin
kernels of TensorRT 10.x+; a kernel can also be named after what it computes,
`__myl_TraMaxSubExpSum_myl0_1`, and then names no node). A `+` inside
brackets is part of a name, not a separator."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

from bisect_tui.core.graph import GraphIndex

MYELIN_SUFFIX = re.compile(r"_myl([0-9]+)_([0-9]+)$")
_FOREIGN = re.compile(r"^\{ForeignNode\[(.*)\]\}$", re.S)


@dataclass(frozen=True)
class NameRange:
    """`{ForeignNode[first...last]}`: every node from first to last in graph order."""

    first: str
    last: str


def _split_top(text: str, sep: str) -> list[str]:
    """Split on `sep` outside parentheses/brackets (node names can hold `+`)."""
    parts, depth, cur, i = [], 0, [], 0
    while i < len(text):
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        if depth == 0 and text.startswith(sep, i):
            parts.append("".join(cur))
            cur = []
            i += len(sep)
            continue
        cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def name_parts(layer_name: str) -> list[Union[str, NameRange]]:
    """The ONNX node names (and ranges) a TensorRT layer name is made of."""
    out: list[Union[str, NameRange]] = []
    for part in _split_top(layer_name.strip(), " + "):
        m = _FOREIGN.match(part)
        if m:
            inner = m.group(1)
            if "..." in inner:
                first, last = inner.split("...", 1)
                out.append(NameRange(first.strip(), last.strip()))
            else:
                out.extend(name_parts(inner))
            continue
        if part.startswith("PWN(") and part.endswith(")"):
            for sub in _split_top(part[4:-1], ","):
                out.extend(name_parts(sub))
            continue
        out.append(part)
    return out


def _resolve_name(name: str, index: GraphIndex) -> Optional[str]:
    if name in index.order:
        return name
    base = MYELIN_SUFFIX.sub("", name)
    if base in index.order:
        return base
    return None


def nodes_from_name(layer_name: str, index: GraphIndex) -> list[str]:
    """ONNX nodes named in a layer name, topological order; unknown names dropped."""
    found: set[str] = set()
    topo = [n.name for n in index.nodes]
    for part in name_parts(layer_name):
        if isinstance(part, NameRange):
            a, b = _resolve_name(part.first, index), _resolve_name(part.last, index)
            if a is None or b is None:
                found.update(x for x in (a, b) if x)
                continue
            i, j = sorted((index.order[a], index.order[b]))
            found.update(topo[i : j + 1])
        else:
            r = _resolve_name(part, index)
            if r:
                found.add(r)
    return sorted(found, key=index.order.__getitem__)
