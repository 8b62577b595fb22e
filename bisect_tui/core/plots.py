"""Pictures for the report: baseline vs fused value distributions overlaid, and
the distribution of the error, per output (the articles' advice: two
histograms that coincide mean the engine is fine; a shifted one is a bug); and
the error along the graph: each tensor's error as a multiple of the tolerance in
topological order, on a log scale, so the jump at the culprit is seen at once.

Drawn from what the comparison already computed (histograms, the probe's
per-tensor errors), so no tensor is reloaded. matplotlib is imported here only,
with the Agg backend (no display over SSH). File names come from
`escape.safe_filename`: an output's name is model-supplied text.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from bisect_tui.core import atomic
from bisect_tui.core.bisect.records import BisectResult, result_of
from bisect_tui.core.escape import safe_filename
from bisect_tui.core.triage.records import OutputVerdict

PROFILE_FILE = "error-along-graph.png"
RATIO_FLOOR = 1e-6  # exact matches are drawn here: log scale has no zero


@dataclass
class ErrorProfile:
    """The error along the graph as the plots and the app draw it."""

    tensors: list[str]
    op_types: list[str]
    ratios: list[float]  # error / tolerance, >1 is out of tolerance
    first_crossing: Optional[int]  # index of the first tensor above the tolerance
    culprits: list[int]  # indexes of tensors made by a culprit

    @classmethod
    def from_summary(cls, shared: Optional[dict], culprit_tensors: Iterable[str] = ()) -> Optional["ErrorProfile"]:
        prof = (shared or {}).get("profile") or []
        if not prof:
            return None
        tensors = [p["tensor"] for p in prof]
        ratios = [float(p["ratio"]) if p["ratio"] is not None else 0.0 for p in prof]
        first = next((i for i, r in enumerate(ratios) if r > 1), None)
        wanted = set(culprit_tensors)
        culprits = [i for i, t in enumerate(tensors) if t in wanted]
        return cls(tensors, [p.get("op_type") or "" for p in prof], ratios, first, culprits)


def culprit_tensors(result: Optional[BisectResult]) -> list[str]:
    """Output tensors of the culprits' fused nodes (their last original node's outputs)."""
    if result is None:
        return []
    by_index = {u["index"]: u for u in result.search.get("units") or [] if isinstance(u, dict) and "index" in u}
    out: list[str] = []
    for c in result.culprits:
        for i in c.units or []:
            out += list((by_index.get(i) or {}).get("outputs") or [])
    return out


def plot_links(plots: dict[str, str], report_path: Path) -> dict[str, str]:
    """Plot name -> link to its file, relative to the report's folder."""
    import os

    base = Path(report_path).resolve().parent
    return {name: os.path.relpath(Path(path).resolve(), base).replace(os.sep, "/") for name, path in plots.items()}


def _plain(text: str, n: int = 40) -> str:
    """Model-supplied text for a matplotlib label: `$` would start mathtext (and an
    unbalanced one raises), so it is escaped; controls are shown, not sent."""
    from bisect_tui.core.escape import term

    return term(str(text)[:n]).replace("$", r"\$")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic.write_bytes(path, buf.getvalue())


def _bars(ax, hist: dict, label: str, color: Optional[str] = None, alpha: float = 0.5) -> None:
    edges = hist["edges"]
    centers = [(edges[i] + edges[i + 1]) / 2 for i in range(len(edges) - 1)]
    width = (edges[1] - edges[0]) if len(edges) > 1 else 1.0
    ax.bar(centers, hist["counts"], width=width, alpha=alpha, label=label, color=color)


def value_histograms(path: Path, name: str, o: OutputVerdict) -> bool:
    """Overlaid baseline/fused value histograms and the error histogram of one tensor."""
    m = o.metrics
    ref, test, err = m.get("ref_hist") or {}, m.get("test_hist") or {}, m.get("error_hist") or {}
    if not ref.get("counts"):
        return False
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    _bars(a1, ref, "baseline (FP32, unfused)")
    if test.get("counts"):
        _bars(a1, test, "fused engine")
    a1.set_title(f"{_plain(name)}: values")
    a1.legend(fontsize=7, loc="upper right")  # "best" searches every point: slow, and matplotlib warns
    if err.get("counts"):
        _bars(a2, err, "error", color="tab:red", alpha=0.7)
    a2.set_title(f"log10 |fused - baseline| ({'PASS' if o.passed else 'FAIL'})")
    fig.tight_layout()
    _save(fig, path)
    return True


def error_profile_png(path: Path, prof: ErrorProfile) -> None:
    """Each tensor's error / tolerance in topological order, log scale, with the
    tolerance line, the first crossing and the culprit's tensors marked."""
    _save(profile_figure(prof), path)


def profile_figure(prof: ErrorProfile):
    """The figure error_profile_png saves (a test reads its axes)."""
    plt = _plt()
    n = len(prof.ratios)
    ys = [max(r, RATIO_FLOOR) if math.isfinite(r) else 1e30 for r in prof.ratios]
    fig, ax = plt.subplots(figsize=(10, 3.4))
    colors = ["tab:red" if r > 1 else "tab:blue" for r in prof.ratios]
    ax.bar(range(n), [y - RATIO_FLOOR for y in ys], width=1.0, color=colors, bottom=RATIO_FLOOR)
    ax.set_yscale("log")
    ax.set_ylim(bottom=RATIO_FLOOR)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="tolerance (x1)")
    if prof.first_crossing is not None:
        i = prof.first_crossing
        ax.axvline(i, color="tab:orange", linewidth=1.2,
                   label=f"first crossing: #{i} {_plain(prof.tensors[i])}")
    if prof.culprits:
        ax.scatter(prof.culprits, [ys[i] * 1.6 for i in prof.culprits], marker="v", color="tab:purple",
                   zorder=3, label="made by the culprit")
    ax.set_xlim(-0.5, max(n - 0.5, 0.5))
    if n <= 24:  # few tensors: each tick names its op (a fractional axis says nothing)
        ax.set_xticks(range(n), [_plain(t, 12) for t in prof.op_types], rotation=45, fontsize=7, ha="right")
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"tensors of the fused graph in topological order ({n})")
    ax.set_ylabel("error / tolerance")
    ax.set_title("error along the graph (fused vs baseline)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def write_plots(out_dir: Path, outputs: dict, shared: Optional[dict] = None,
                result=None) -> dict[str, str]:
    """One PNG per output plus the error along the graph; returns plot name -> file path.

    The exporter hands report.json's parts as JSON (`outputs`: name -> the
    output's verdict, `result`: the bisection's, or its BisectResult): read
    here into their records once. The name of the error-along-the-graph plot
    is PROFILE_FILE."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    taken: set[str] = {PROFILE_FILE.lower().removesuffix(".png")}
    for name, o in outputs.items():
        path = out_dir / (safe_filename(name, taken) + ".png")
        if value_histograms(path, name, o if isinstance(o, OutputVerdict) else OutputVerdict.from_json(o)):
            written[name] = str(path)
    prof = ErrorProfile.from_summary(shared, culprit_tensors(result_of(result)))
    if prof is not None:
        path = out_dir / PROFILE_FILE
        error_profile_png(path, prof)
        written[PROFILE_FILE] = str(path)
    return written
