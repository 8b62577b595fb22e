"""PNG per compared tensor: golden and test value histograms overlaid on the same
bins (the article's picture: curves that coincide mean the engine is fine, a
shifted one is a bug), and the histogram of log10 |test - golden|, which also
shows what the overlay cannot (a reordered batch has identical value histograms
but a second bump of errors).

Drawn from the histograms metrics.compare already computed, so no tensor is
read again. matplotlib is imported here only, with the Agg backend.
"""

from __future__ import annotations

import io
from pathlib import Path

from bisect_tui.core import atomic
from bisect_tui.core.compare.records import TensorResult
from bisect_tui.core.escape import term


def _title(name: str) -> str:
    """A name as a matplotlib title: `$` would start mathtext, controls are shown."""
    text = term(name).replace("$", r"\$")
    return text if len(text) <= 50 else text[:49] + "…"


def _bars(ax, hist: dict, **kw) -> None:
    e = hist["edges"]
    ax.bar([(e[i] + e[i + 1]) / 2 for i in range(len(e) - 1)], hist["counts"],
           width=(e[1] - e[0]) if len(e) > 1 else 1.0, **kw)


def draw(t: TensorResult, path: Path) -> bool:
    """Write the tensor's PNG; False when there is nothing finite to draw."""
    m = t.metrics
    ref, test, err = m.get("ref_hist") or {}, m.get("test_hist") or {}, m.get("error_hist") or {}
    if not ref.get("counts"):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    _bars(a1, ref, alpha=0.5, label=f"golden ({m.get('ref_dtype', '')})")
    if test.get("counts"):
        _bars(a1, test, alpha=0.5, label=f"test ({m.get('test_dtype', '')})")
    a1.set_title(f"{_title(t.pair.test.name)}: values")
    a1.legend(fontsize=7, loc="upper right")  # "best" searches every point: slow, and matplotlib warns
    if err.get("counts"):
        _bars(a2, err, color="tab:red", alpha=0.7)
    a2.set_title(f"log10 |test - golden| ({'PASS' if t.passed else 'FAIL'})")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic.write_bytes(path, buf.getvalue())
    return True
