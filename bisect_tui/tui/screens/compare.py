"""The compare view: one row per test tensor, and for the highlighted one the golden
and test value histograms overlaid on the same bins, the error histogram, what
was converted and what the pitfall detectors found.

Opened by `bisect-tui compare GOLDEN TEST --tui` through `CompareApp`, a small
app of its own: the result is already computed (no engine work, no threads), so
it needs none of the triage app's machinery.
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from bisect_tui.core.compare.report import shows_ranking
from bisect_tui.core.compare.records import CompareResult, TensorResult
from bisect_tui.core.compare.report import values_line, verdict_line
from bisect_tui.core.escape import term
from bisect_tui.core.report import cos_text, fmt
from bisect_tui.tui.format import short
from bisect_tui.tui.widgets.common import LabeledSparkline

BOTH, GOLDEN_ONLY, TEST_ONLY = "█", "░", "▒"
LEGEND = f"{BOTH} golden and test  {GOLDEN_ONLY} golden only  {TEST_ONLY} test only"


def overlay_rows(golden: Sequence[int], test: Sequence[int], height: int = 6, width: int = 0) -> list[str]:
    """Two histograms over the same bins drawn into one block of text, top row first.

    Both share one vertical scale, so a shifted or widened test distribution shows
    as shaded cells on one side only; the shading (not colour) tells them apart.
    Each bin gets `width // bins` columns (at least one)."""
    n = len(golden)
    if n == 0 or len(test) != n or height < 1:
        return []
    top = max(max(golden), max(test), 1)
    cols = max(1, width // n) if width else 1
    rows = []
    for r in range(height):
        level = (height - r - 0.5) / height * top
        line = []
        for g, t in zip(golden, test):
            ch = BOTH if g >= level and t >= level else GOLDEN_ONLY if g >= level else TEST_ONLY if t >= level else " "
            line.append(ch * cols)
        rows.append("".join(line))
    return rows


class OverlayHistogram(Static):
    DEFAULT_CSS = """
    OverlayHistogram { height: auto; margin-top: 1; }
    """

    def show(self, t: TensorResult) -> None:
        m = t.metrics
        ref, tst = m.get("ref_hist") or {}, m.get("test_hist") or {}
        if not ref.get("counts"):
            self.update(Text("values: no finite values to draw"))
            return
        width = max(self.content_size.width, 40)
        rows = overlay_rows(ref["counts"], tst["counts"], 6, width)
        text = Text()
        text.append("values, golden vs test on the same bins\n", style="bold")
        for row in rows:
            for ch in row:
                style = {"█": "bold", "░": "blue", "▒": "dark_orange"}.get(ch, "")
                text.append(ch, style=style)
            text.append("\n")
        edges = ref["edges"]
        used = len(rows[0]) if rows else 0
        left, right = fmt(edges[0]), fmt(edges[-1])
        text.append(left + " " * max(1, used - len(left) - len(right)) + right + "\n", style="dim")
        text.append(LEGEND)
        self.update(text)


class CompareScreen(Screen):
    BINDINGS = [
        Binding("q", "quit_view", "Quit"),
        Binding("escape", "quit_view", "Back", show=False),
    ]
    DEFAULT_CSS = """
    CompareScreen #cmp-verdict { height: auto; padding: 0 1; text-style: bold; }
    CompareScreen #cmp-table { height: auto; max-height: 40%; }
    CompareScreen #cmp-detail { height: 1fr; border: round $primary-darken-2; padding: 0 1; }
    CompareScreen #cmp-details { margin-top: 1; }
    """

    def __init__(self, result: CompareResult) -> None:
        super().__init__()
        self.result = result

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text(verdict_line(self.result)), id="cmp-verdict")
        table = DataTable(id="cmp-table", cursor_type="row", zebra_stripes=True)
        yield table
        with VerticalScroll(id="cmp-detail"):
            yield Static("", id="cmp-summary")
            yield OverlayHistogram("", id="cmp-hist")
            yield LabeledSparkline(id="cmp-err")
            yield Static("", id="cmp-details")
            yield Static("", id="cmp-findings")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"{term(self.result.golden.path)} vs {term(self.result.test.path)}"
        table = self.query_one("#cmp-table", DataTable)
        table.add_columns("verdict", "test tensor", "golden tensor", "max abs", "cosine", "top-1")
        for i, t in enumerate(self.result.tensors):
            m = t.metrics
            top1 = m.get("top1_agreement") if shows_ranking(t) else None  # box coordinates rank nothing
            table.add_row(
                Text("✔ PASS" if t.passed else "✘ FAIL"),
                Text(short(term(t.pair.test.name), 24)),
                Text(short(term(t.pair.golden.name), 24)),
                Text(fmt(m["max_abs"])),
                Text(cos_text(m["cosine"])),
                Text("-" if top1 is None else f"{top1:.0%}"),
                key=str(i),
            )
        table.focus()
        if self.result.tensors:
            self.show_tensor(0)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self.show_tensor(int(event.row_key.value))

    def on_resize(self) -> None:
        if self.result.tensors:
            self.show_tensor(self.current)

    current = 0

    def show_tensor(self, i: int) -> None:
        self.current = i
        t = self.result.tensors[i]
        p = t.pair
        s = Text()
        s.append(f"{'✔ PASS' if t.passed else '✘ FAIL'}: ", style="bold")
        s.append(f"{term(p.test.name)} vs golden {term(p.golden.name)} ({term(p.how)})\n")
        s.append(values_line(t))
        self.query_one("#cmp-summary", Static).update(s)
        d = Text()
        d.append(f"tolerance {t.tolerance.describe()} (from {term(t.tolerance_from)})")
        if not t.verdict.passed:
            d.append(f"\n{t.verdict.summary()}")
        for c in t.conversions:
            d.append(f"\nconverted {term(c.text())}")
        if t.naive_max_abs is not None:
            d.append(f"\nnaive |golden - test| on the stored values: max {fmt(t.naive_max_abs)}")
        self.query_one("#cmp-details", Static).update(d)
        self.query_one("#cmp-hist", OverlayHistogram).show(t)
        err = t.metrics.get("error_hist") or {}
        edges = err.get("edges") or []
        self.query_one("#cmp-err", LabeledSparkline).set(
            "log10 |test - golden|", err.get("counts") or [],
            f"1e{edges[0]:.1f}" if edges else "", f"1e{edges[-1]:.1f}" if edges else "")
        f = Text()
        for finding in t.findings:
            f.append(f"finding ({finding.kind}): ", style="bold")
            f.append(f"{finding.text}\n")
            f.append("fix: ", style="bold")
            f.append(f"{finding.fix}\n")
        if not t.findings:
            f.append("no pitfall found (softmax on one side, batch order, ranking)" if not t.passed else "")
        self.query_one("#cmp-findings", Static).update(f)

    def action_quit_view(self) -> None:
        if isinstance(self.app, CompareApp):
            self.app.exit(self.result.exit_code, return_code=self.result.exit_code)
        else:
            self.app.pop_screen()


class CompareApp(App[int]):
    """Shows one finished compare result; exits with its exit code."""

    TITLE = "bisect-tui compare"

    def __init__(self, result: CompareResult) -> None:
        super().__init__()
        self.result = result

    def on_mount(self) -> None:
        self.push_screen(CompareScreen(self.result))
