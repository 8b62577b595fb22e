"""The error on the graph itself: per-node data for Google's Model Explorer
(ai-edge-model-explorer), the graph viewer that overlays per-node numbers on a
model. Opened beside the ONNX model ("Node data" > load JSON), it colours each
node by its error against the baseline as a multiple of the tolerance, so the
place where the error starts is seen on the graph, and the culprits stand out.

The file is one `GraphNodeData` as the package documents it
(model_explorer/node_data_builder.py): `results` maps a node key to
`{"value": number, "bgColor"?, "textColor"?}`; `thresholds` colour the values
(each item the upper bound of a range). Keys are output tensor names: Model
Explorer matches them to the node whose `outputsMetadata` names that tensor.

Values are what the session measured, never made up: each tensor the fused
engine still exposes (the fused-graph probe's profile), each model output
(its worst element against atol + rtol*|ref|); a culprit's interior tensors,
which the fused engine hides, carry the value of its fused node's outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from bisect_tui.core import atomic
from bisect_tui.core.bisect.records import BisectResult, result_of
from bisect_tui.core.report.words import tolerance_text

CULPRIT_BG, CULPRIT_TEXT = "#b71c1c", "#ffffff"
# value = error / tolerance: within it, up to 10x over it, further over it
THRESHOLDS = ({"value": 1, "bgColor": "#c8e6c9"}, {"value": 10, "bgColor": "#ffcc80"},
              {"value": 1e300, "bgColor": "#ef5350"})


def _ratio(x) -> Optional[float]:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None  # NaN is no measurement


def _culprit_regions(b: Optional[BisectResult]) -> list[tuple[list[str], list[str]]]:
    """Each culprit's fused region: its output tensors, and every tensor of it
    (the outputs and the interior ones the fused engine hides)."""
    if b is None:
        return []
    units = {u["index"]: u for u in b.search.get("units") or [] if isinstance(u, dict) and "index" in u}
    regions = []
    for c in b.culprits:
        for i in c.units or []:
            u = units.get(i) or {}
            outputs = list(u.get("outputs") or [])
            regions.append((outputs, [*outputs, *(u.get("interior") or [])]))
    return regions


def node_data(s: dict) -> dict:
    """Model Explorer node data (one graph) from a finished session's report.json
    (its dict, as read: the result under `bisect` becomes its record here)."""
    results: dict[str, dict] = {}
    for p in (s.get("shared_tensors") or {}).get("profile") or []:
        r = _ratio(p.get("ratio"))
        if r is not None:
            results[p["tensor"]] = {"value": r}
    for name, o in (s.get("outputs") or {}).items():
        r = _ratio((o.get("metrics") or {}).get("allclose_max_ratio"))
        if r is not None:
            results[name] = {"value": r}
    for outputs, tensors in _culprit_regions(result_of(s.get("bisect"))):
        measured = [results[t]["value"] for t in outputs if t in results]
        value = max(measured) if measured else None
        for t in tensors:
            v = results.get(t, {}).get("value", value)
            results[t] = {"value": v if v is not None else 0, "bgColor": CULPRIT_BG, "textColor": CULPRIT_TEXT}
    tol = tolerance_text(s.get("tolerance") or {})
    return {
        "name": f"bisect-tui: error / tolerance ({tol}); >1 breaks it; dark red: culprit",
        "results": results,
        "thresholds": [dict(t) for t in THRESHOLDS],
    }


def write_model_explorer(session_dir: Path, dest: Optional[Path] = None) -> Path:
    """Write the node data of the finished session in `session_dir` (its
    report.json) to `dest`, by default `model-explorer.json` in the session."""
    session_dir = Path(session_dir)
    s = json.loads((session_dir / "report.json").read_text(encoding="utf-8"))
    dest = Path(dest) if dest else session_dir / "model-explorer.json"
    atomic.write_text(dest, json.dumps(node_data(s), indent=1) + "\n")
    return dest


__all__ = ["node_data", "write_model_explorer"]
