"""The detail panes of the comparison step and the bisection summary."""

from __future__ import annotations

from typing import Optional

from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from bisect_tui.core.report import BISECT_VERDICT
from bisect_tui.core.report.sections import engine_section
from bisect_tui.core.triage.records import CheckResult
from bisect_tui.tui.format import fmt, ratio, short, verdict_word
from bisect_tui.tui.state import TriageState
from bisect_tui.tui.widgets.stepview import StepView, T, _fill


class ComparisonView(StepView):
    step = "fused"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._names: list[str] = []
        self._fused: Optional[CheckResult] = None

    def compose_body(self) -> ComposeResult:
        from bisect_tui.tui.widgets.common import LabeledSparkline

        from bisect_tui.tui.widgets.errorprofile import ErrorProfileChart

        yield Static("", classes="view-text", id="cmp-text")
        yield DataTable(id="cmp-table", cursor_type="row", zebra_stripes=True)
        yield Static("", classes="view-text", id="cmp-detail")
        yield LabeledSparkline(id="spark-ref")
        yield LabeledSparkline(id="spark-test")
        yield LabeledSparkline(id="spark-err")
        yield Static(T("Error along the graph (each tensor's error / tolerance, log scale; f: full screen):",
                       "bold"), classes="view-text", id="profile-title")
        yield ErrorProfileChart(id="cmp-profile")

    def render_body(self, st: TriageState) -> None:
        text = self.query_one("#cmp-text", Static)
        table = self.query_one("#cmp-table", DataTable)
        widgets = [table, self.query_one("#cmp-detail"), self.query_one("#spark-ref"),
                   self.query_one("#spark-test"), self.query_one("#spark-err"), self.query_one("#cmp-profile"),
                   self.query_one("#profile-title")]
        f = st.fused
        self._fused = f
        if not f:
            p = st.live.get("fused")
            text.update(T("Builds the fused engine with the settings above, runs it on the same inputs "
                          "and compares every output with the baseline."
                          + (f"\n{p['text']}" if p else " Press r to run.")))
            for w in widgets:
                w.add_class("hidden")
            return
        eng = engine_section(f).data  # the report's engine section, of the same record
        entries = ", ".join(f"{k}={v}" for k, v in eng["entries"])
        n_fail = len(f.failing_outputs)
        result = st.bisect.result if st.bisect is not None else None
        done = result.final_verdict if result is not None else None
        # a "next" that is behind the user is not offered: after the search, its verdict
        ahead = (f"bisected: {BISECT_VERDICT.get(done, done)} (b shows the search)" if done
                 else "press b to bisect")
        verdict = ("✔ PASS: every output within tolerance" if f.passed
                   else f"✘ FAIL: {n_fail} of {len(f.outputs)} output(s) break tolerance; {ahead}")
        if f.error:  # the engine did not build or run while the baseline did
            verdict = (f"✘ FAIL ({f.error['kind']}): the fused engine "
                       + ("does not build" if f.error["kind"] == "build_error" else "fails while running")
                       + f": {f.error['message']}; {ahead}")
        sens = f.sensitivity or {}
        sens_line = ""
        if sens.get("amplifies"):
            sens_line = (f"\n⚠ sensitivity: a 1-ulp input change moves the FP32 outputs to x{fmt(sens['ratio'])} "
                         "of the tolerance: the model amplifies rounding, every fusion may look guilty")
        sh = f.shared_tensors or {}
        if sh.get("first_failing_tensor"):
            sens_line += f"\nfirst tensor out of tolerance inside the fused graph: {sh['first_failing_tensor']}"
            if f.passed:
                sens_line += " (inner tensors only: the outputs pass)"
        text.update(T(
            f"engine {eng['engine']} level={eng['level']} precision={eng['precision']}"
            + (f" {entries}" if entries else "")
            + (f" disabled={','.join(eng['disabled'])}" if eng["disabled"] else "")
            + f"\n{len(f.fused_nodes)} fused node(s) of {f.optimized_nodes} in the optimized graph "
            f"({f.original_nodes} original)\n{verdict}" + sens_line
        ))
        self._names = list(f.outputs)
        rows = []
        for name, o in f.outputs.items():
            m = o.metrics
            failed = ", ".join(o.verdict.get("failed", [])) or "-"
            rows.append([short(name, 24), verdict_word(o.passed), failed, fmt(m["max_abs"]),
                         fmt(m["mean_abs"]), fmt(m["max_rel"]), fmt(m["cosine"], 6), fmt(m["snr_db"]),
                         ratio(o.verdict.get("ratio"))])
        table.border_title = "Outputs"
        _fill(table, ["output", "verdict", "failed", "max abs", "mean abs", "max rel", "cosine",
                      "SNR dB", "x tol"], rows, title="Outputs: fused engine vs baseline",
              optional=("mean abs", "SNR dB", "max rel"))
        for w in widgets:
            w.remove_class("hidden")
        self.query_one("#cmp-profile").show(self.profile(st))
        first_fail = next((i for i, n in enumerate(self._names) if not f.outputs[n].passed), 0)
        if first_fail:
            table.move_cursor(row=first_fail)
        self.show_output(first_fail)

    def profile(self, st: TriageState):
        """The error along the graph, with the culprit's tensors once the search found them."""
        from bisect_tui.core.plots import ErrorProfile, culprit_tensors

        if not st.fused:
            return None
        return ErrorProfile.from_summary(st.fused.shared_tensors, culprit_tensors(st.bisect.result))

    @property
    def selected_output(self) -> Optional[str]:
        if not self._names:
            return None
        row = self.query_one("#cmp-table", DataTable).cursor_row or 0
        return self._names[min(max(row, 0), len(self._names) - 1)]

    def show_output(self, i: int) -> None:
        from bisect_tui.tui.widgets.common import LabeledSparkline

        if not self._fused or not self._names:
            return
        i = min(max(i, 0), len(self._names) - 1)
        name = self._names[i]
        o = self._fused.outputs[name]
        m = o.metrics
        tol = o.tolerance or {}
        within = m.get("within_0.1pct")
        self.query_one("#cmp-detail", Static).update(T(
            f"{name}: {o.summary}\ntolerance {tol.get('name', '')}"
            + (f"; {within * 100:.1f}% of elements within 0.1% relative error" if within is not None else "")
        ))
        ref, test, err = m.get("ref_hist") or {}, m.get("test_hist") or {}, m.get("error_hist") or {}

        def edges(h: dict, pre: str = "", post: str = "") -> tuple[str, str]:
            e = h.get("edges") or []
            if not e:
                return "", ""
            return f"{pre}{fmt(e[0])}{post}", f"{pre}{fmt(e[-1])}{post}"

        self.query_one("#spark-ref", LabeledSparkline).set(
            "baseline (FP32 unfused) values", ref.get("counts", []), *edges(ref))
        self.query_one("#spark-test", LabeledSparkline).set(
            "fused engine values (same bins)", test.get("counts", []), *edges(test))
        e = err.get("edges") or []
        self.query_one("#spark-err", LabeledSparkline).set(
            "|fused - baseline| (log10)", err.get("counts", []),
            *((f"1e{e[0]:.1f}", f"1e{e[-1]:.1f}") if e else ("", "")))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "cmp-table":
            event.stop()
            self.show_output(event.cursor_row)


class BisectSummaryView(StepView):
    step = "bisect"

    def compose_body(self) -> ComposeResult:
        yield Static("", classes="view-text", id="bsum-text")

    def render_body(self, st: TriageState) -> None:
        b = st.bisect
        lines = []
        if b.result:
            r = b.result
            verdict = r.final_verdict
            reused = r.search.get("reused_steps")
            mark = {"culprits": "✔ found:", "pass": "✔"}.get(verdict, "?")
            lines.append(f"{mark} {BISECT_VERDICT.get(verdict, verdict)} ({r.engine_builds} engine builds"
                         + (f", {reused} steps reused" if reused else "") + ")")
            for i, c in enumerate(r.culprits, 1):
                lines.append(f"culprit {i}: {c.op_type} from {', '.join(c.optimizers) or '?'}")
                lines.append(f"  replaces {', '.join(c.original_nodes)}")
        elif b.status == "running":
            lines.append(f"running: {b.builds} build(s) so far")
        elif b.status in ("cancelled", "interrupted"):
            lines.append(f"{b.status} with {len(b.steps) or b.recorded} step(s) recorded; "
                         "press b to resume (recorded steps are reused)")
        else:
            lines.append("Finds the fused node(s) that break tolerance by rebuilding the engine with "
                         "fusions blocked in halves.")
        lines.append("")
        lines.append("Press b to open the bisection" + (" and start it." if not b.result else "."))
        self.query_one("#bsum-text", Static).update(T("\n".join(lines)))
