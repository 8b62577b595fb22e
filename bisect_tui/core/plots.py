"""Pictures for the report: baseline vs fused value distributions overlaid, and
the distribution of the error, per output (the articles' advice: two
histograms that coincide mean the engine is fine; a shifted one is a bug).

Drawn from the histograms the comparison already computed, so no tensor is
reloaded. matplotlib is imported here only, with the Agg backend (no display
over SSH).
"""

from __future__ import annotations

from pathlib import Path

from bisect_tui.core import atomic
from bisect_tui.core.escape import safe_filename, term


def _title(name: str) -> str:
    """A model name as a matplotlib title: `$` would start mathtext (and a bad
    formula raises), controls are shown, very long names are cut."""
    text = term(name).replace("$", r"\$")
    return text if len(text) <= 60 else text[:59] + "…"


def plot_links(plots: dict[str, str], report_path: Path) -> dict[str, str]:
    """Output name -> link to its plot, relative to the report's folder."""
    import os

    base = Path(report_path).resolve().parent
    return {name: os.path.relpath(Path(path).resolve(), base) for name, path in plots.items()}


def write_plots(out_dir: Path, outputs: dict) -> dict[str, str]:
    """One PNG per output; returns output name -> file path."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    taken: set[str] = set()  # two outputs that sanitize alike each keep their own plot
    for name, o in outputs.items():
        m = o["metrics"]
        ref, test, err = m.get("ref_hist") or {}, m.get("test_hist") or {}, m.get("error_hist") or {}
        if not ref.get("counts"):
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
        edges = ref["edges"]
        centers = [(edges[i] + edges[i + 1]) / 2 for i in range(len(edges) - 1)]
        width = edges[1] - edges[0]
        a1.bar(centers, ref["counts"], width=width, alpha=0.5, label="baseline (FP32, unfused)")
        a1.bar(centers, test["counts"], width=width, alpha=0.5, label="fused engine")
        a1.set_title(f"{_title(name)}: values")
        a1.legend(fontsize=7)
        if err.get("counts"):
            e = err["edges"]
            a2.bar([(e[i] + e[i + 1]) / 2 for i in range(len(e) - 1)], err["counts"], width=e[1] - e[0],
                   color="tab:red", alpha=0.7)
        a2.set_title(f"log10 |fused - baseline| ({'PASS' if o['passed'] else 'FAIL'})")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        path = out_dir / f"{safe_filename(name, taken)}.png"
        atomic.write_bytes(path, buf.getvalue())
        written[name] = str(path)
    return written
