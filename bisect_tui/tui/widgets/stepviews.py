"""The detail pane of each checklist step. Each view renders from the app's TriageState."""

from __future__ import annotations

import math
from typing import Optional

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, ProgressBar, Static

from bisect_tui.core.report import determinism_line, range_lines
from bisect_tui.core.stats import FP16_MAX, LOG2_LO
from bisect_tui.tui.format import (
    clip_hist, fmt, mb, mini_spark, ratio, short, show_path, state_label, verdict_word, shown
)
from bisect_tui.tui.state import TriageState
from bisect_tui.tui.texts import STEP_NAME

MAX_ROWS = 400  # rows shown in per-tensor tables (sorted so the interesting ones come first)
SPARK_LO, SPARK_HI = -26, 16  # log2 range of the headroom sparkline: FP16 zero .. FP16 overflow


def T(s: str, style: str = "") -> Text:
    return Text(shown(s), style=style)  # names from the model never reach the terminal raw


class StepView(Vertical):
    """Base: a title line, then the step's own widgets."""

    step = "inputs"

    DEFAULT_CSS = """
    StepView { height: auto; }
    StepView > .view-title { text-style: bold; height: 1; }
    StepView > .view-text { height: auto; }
    StepView DataTable { height: 3; margin-top: 1; border: round $primary-darken-3; }
    StepView DataTable:focus { border: heavy $accent; }
    StepView .hidden { display: none; }
    """

    def compose_body(self) -> ComposeResult:
        yield from ()

    def compose(self) -> ComposeResult:
        yield Static("", classes="view-title")
        yield from self.compose_body()

    def render_state(self, st: TriageState) -> None:
        state = st.states.get(self.step, "pending")
        note = st.notes.get(self.step)
        title = f"{STEP_NAME[self.step]}: {state_label(state)}" + (f" ({note})" if note else "")
        self.query_one(".view-title", Static).update(T(title))
        self.render_body(st)

    def render_body(self, st: TriageState) -> None:
        pass


STEP_LIST_W = 27  # the checklist column (widgets/common.py)
WHY_SIDE_W = 34  # the why panel beside the detail from 140 columns (app.tcss)


def pane_width(app) -> int:
    """Cells the detail pane gives a table, from the terminal width (known before
    layout, so the hints never depend on timing)."""
    w = app.size.width - STEP_LIST_W - 8  # the pane's border, padding and scrollbar; the table's border
    if app.size.width >= 140 and getattr(app, "why_shown", True):
        w -= WHY_SIDE_W
    return max(w, 20)


def _col_width(label: str, cells: list[list[Text]], i: int) -> int:
    return min(max([cell_len(label)] + [r[i].cell_len for r in cells]), 40)


def _fill(table: DataTable, columns: list[str], rows: list[list], max_height: int = 12,
          title: str = "", optional: tuple[str, ...] = ()) -> None:
    """Fill a table; `optional` columns (least useful first) leave the pane when
    the rest would not fit. The full-screen view (f) always has every column."""
    cells = [[c if isinstance(c, Text) else T(c) for c in r] for r in rows]
    table.full_data = (title or table.border_title or "table", list(columns), cells)
    keep = list(range(len(columns)))
    room = pane_width(table.app)
    for name in optional:
        if sum(_col_width(columns[i], cells, i) + 2 for i in keep) <= room:
            break
        keep.remove(columns.index(name))
    dropped = len(columns) - len(keep)
    columns = [columns[i] for i in keep]
    cells = [[r[i] for i in keep] for r in cells]
    table.clear(columns=True)
    # Explicit column widths: DataTable measures new rows lazily, so its own widths
    # (and so the screen) would depend on when the screen is drawn.
    for i, label in enumerate(columns):
        width = max([cell_len(label)] + [c.cell_len for c in (r[i] for r in cells)])
        table.add_column(label, width=min(width, 40))
    for r in cells:
        table.add_row(*r)
    # An explicit height (header + rows + a row for the horizontal scrollbar + the border)
    # instead of `auto`: the table's auto height is known only after it measured its new
    # rows, so the layout would depend on timing.
    table.styles.height = min(len(rows) + 4, max_height + 2)
    widths = sum(_col_width(label, cells, i) + 2 for i, label in enumerate(columns))
    hints = []
    if widths > room:
        hints.append("←→ scroll")
    if dropped:
        hints.append(f"{dropped} more column(s)")
    if len(rows) > max_height - 1:
        hints.append(f"↑↓ {len(rows)} rows")
    hints.append("f full screen")
    table.border_subtitle = " · ".join(hints)


def _num(v, dtype: str) -> str:
    """Integers as integers (a sample rate reads 16000, not 1.60e+04)."""
    if v is not None and dtype.startswith(("int", "uint", "bool")):
        return str(int(v))
    return fmt(v)


class InputsView(StepView):
    step = "inputs"

    def compose_body(self) -> ComposeResult:
        yield Static("", classes="view-text", id="inputs-text")
        yield DataTable(id="inputs-table", cursor_type="row", zebra_stripes=True)
        yield Static("", classes="view-text", id="inputs-more")

    def render_body(self, st: TriageState) -> None:
        o = st.options
        lines = [f"model:   {show_path(o.model)}"]
        table = self.query_one("#inputs-table", DataTable)
        more = self.query_one("#inputs-more", Static)
        if st.info:
            i = st.info
            lines.append(f"graph:   {i['nodes']} nodes, opset {i['opset']}, sha256 {i['sha256'][:12]}")
        lines.append(f"session: {show_path(st.session_root) if st.session_root else '(chosen when the model loads)'}")
        if o.input_file:
            lines.append(f"inputs:  from file {show_path(o.input_file)}")
        else:
            from bisect_tui.tui.screens.settings import shapes_text, values_text

            lines.append(f"inputs:  generated, seed {o.seed}, {o.samples} sample(s)"
                         + (f", shapes {shapes_text(o.shapes)}" if o.shapes else "")
                         + (f", fixed {values_text(o.input_values)}" if o.input_values else ""))
        if st.inputs:
            arrays = st.inputs.get("arrays", [])
            table.border_title = "Inputs (how each was made)"
            _fill(table, ["input", "dtype", "shape", "min", "max", "made as"],
                  [[a["name"], a["dtype"], "x".join(map(str, a["shape"])) or "scalar",
                    _num(a.get("min"), a["dtype"]), _num(a.get("max"), a["dtype"]),
                    (a.get("how") or "") + (f" values {a['values']}" if a.get("values") is not None else "")]
                   for a in arrays])
            table.remove_class("hidden")
            ops = sorted(st.info["op_counts"].items(), key=lambda kv: (-kv[1], kv[0])) if st.info else []
            more.update(T(
                f"outputs: {', '.join(st.info['outputs']) if st.info else '-'}\n"
                f"ops:     {', '.join(f'{k} x{v}' for k, v in ops[:8])}"
                + (f", +{len(ops) - 8} more" if len(ops) > 8 else "")
                + "\nThe exact inputs are saved as input.npz in the session: every engine gets the same data."
            ))
        elif st.suggestion is not None:
            table.add_class("hidden")
            more.update(T("✘ " + st.input_error + "\n\nPress o: the settings form opens with these values "
                          "filled in (shapes, fixed values, or an input file); enter applies, r runs."))
        else:
            table.add_class("hidden")
            more.update(T("Press r to load the model, fix the inputs and open the session."))
        self.query_one("#inputs-text", Static).update(T("\n".join(lines)))


class BaselineView(StepView):
    step = "baseline"

    def compose_body(self) -> ComposeResult:
        yield Static("", classes="view-text", id="baseline-text")
        yield ProgressBar(id="baseline-progress", show_eta=False)
        yield Static("", classes="view-text", id="baseline-live")
        yield DataTable(id="baseline-table", cursor_type="row", zebra_stripes=True)

    def render_body(self, st: TriageState) -> None:
        text = self.query_one("#baseline-text", Static)
        bar = self.query_one("#baseline-progress", ProgressBar)
        live = self.query_one("#baseline-live", Static)
        table = self.query_one("#baseline-table", DataTable)
        budget = st.options.max_memory
        p = st.live.get("baseline")
        if st.manifest:
            m = st.manifest
            opts = m.get("options", {})
            text.update(T(
                f"{len(m['tensors'])} tensors dumped ({mb(m['bytes'])}) in {opts.get('groups', 1)} group(s); "
                f"{opts.get('optimization', 'ORT_DISABLE_ALL')}, {opts.get('precision', 'fp32').upper()}, CPU"
                + ("; reused from an earlier run" if st.baseline_reused else "")
                + (f"\n{len(m['skipped'])} tensor(s) could not be dumped" if m.get("skipped") else "")
                + f"\nfiles: {show_path(st.session_root / 'baseline') if st.session_root else 'baseline/'}"
                "/layer_<index>_<op>_<tensor>.npy"
            ))
            bar.update(total=max(len(m["tensors"]), 1), progress=len(m["tensors"]))
            live.update(T(f"memory budget {mb(opts.get('max_memory_bytes', budget or 0))}"))
            rows = [[e["index"], e["op_type"], short(e["tensor"], 40), "x".join(map(str, e["shape"])),
                     fmt(e["stats"]["abs_max"])] for e in m["tensors"][:MAX_ROWS]]
            _fill(table, ["#", "op", "tensor", "shape", "|x| max"], rows)
            table.remove_class("hidden")
        else:
            table.add_class("hidden")
            text.update(T("Runs the model with every optimization off (ORT_DISABLE_ALL), FP32 on CPU, "
                          "and saves every intermediate tensor. Press r to run."))
            if p:
                bar.update(total=p.get("total") or None, progress=p.get("done", 0))
                d = p.get("data", {})
                live.update(T(f"{int(p.get('done', 0))}/{int(p.get('total') or 0)} tensors, "
                              f"{d.get('mb_written', 0):.1f} MB written, "
                              f"memory budget {d.get('budget_mb', 0):.0f} MB"))
            else:
                bar.update(total=None, progress=0)
                live.update(T(f"memory budget {mb(budget)}" if budget else "memory budget: 1/4 of free RAM"))


class DeterminismView(StepView):
    step = "determinism"

    def compose_body(self) -> ComposeResult:
        yield Static("", classes="view-text", id="det-text")
        yield DataTable(id="det-table", cursor_type="row", zebra_stripes=True)

    def render_body(self, st: TriageState) -> None:
        text = self.query_one("#det-text", Static)
        table = self.query_one("#det-table", DataTable)
        d = st.determinism
        if not d:
            p = st.live.get("determinism")
            text.update(T("Runs the baseline a second time in fresh sessions and compares every tensor "
                          "bit for bit." + (f"\n{p['text']}" if p else " Press r to run.")))
            table.add_class("hidden")
            return
        line = determinism_line(d)
        if d.get("advice"):
            line += "\n" + d["advice"]
        text.update(T(line))
        if d.get("differing"):
            _fill(table, ["#", "tensor", "node", "op"],
                  [[e["index"], e["tensor"], e["node"], e["op_type"]] for e in d["differing"][:MAX_ROWS]])
            table.remove_class("hidden")
        else:
            table.add_class("hidden")


class RangeView(StepView):
    step = "range_check"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._rows: list[dict] = []

    def compose_body(self) -> ComposeResult:
        from bisect_tui.tui.widgets.common import LabeledSparkline

        yield Static("", classes="view-text", id="range-text")
        yield DataTable(id="nan-table", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="headroom-table", cursor_type="row", zebra_stripes=True)
        yield LabeledSparkline(id="range-spark")

    def render_body(self, st: TriageState) -> None:
        from bisect_tui.tui.widgets.common import LabeledSparkline

        text = self.query_one("#range-text", Static)
        nan_t = self.query_one("#nan-table", DataTable)
        head_t = self.query_one("#headroom-table", DataTable)
        spark = self.query_one("#range-spark", LabeledSparkline)
        rc = st.range_check
        if not rc or not st.manifest:
            text.update(T("Looks for NaN/Inf (and the node where they start), FP16/BF16 headroom and "
                          "values outside expected ranges, from the baseline's statistics. Press r to run."))
            for w in (nan_t, head_t, spark):
                w.add_class("hidden")
            return
        lines = range_lines(rc)
        origin = rc.get("nan_inf_origin")
        if origin:
            lines.append(origin["advice"])
        text.update(T("\n".join(lines)))
        if rc["nan_inf"]:
            _fill(nan_t, ["tensor", "op", "NaN", "Inf", "elements"],
                  [[e["tensor"], e["op_type"], e["nan"], e["inf"], e["numel"]] for e in rc["nan_inf"][:MAX_ROWS]])
            nan_t.remove_class("hidden")
        else:
            nan_t.add_class("hidden")
        rows = []
        for e in st.manifest["tensors"]:
            s = e["stats"]
            if e["dtype"] not in ("float32", "float64", "float16"):
                continue
            amax = s["abs_max"] or 0.0
            room = FP16_MAX / amax if amax else math.inf
            rows.append({"e": e, "room": room})
        rows.sort(key=lambda r: (r["room"], r["e"]["index"]))
        self._rows = rows[:MAX_ROWS]
        lo_all, hi_all = _nonzero_span([r["e"]["stats"]["log2_hist"] for r in self._rows])
        table_rows = []
        for r in self._rows:
            e, s = r["e"], r["e"]["stats"]
            hist = s["log2_hist"][lo_all:hi_all + 1]
            room = "inf" if math.isinf(r["room"]) else (f"{r['room']:.3g}x" if r["room"] < 1e4 else f"{r['room']:.1e}x")
            flag = "OVERFLOW" if s["fp16_overflow"] else ("near" if r["room"] < 4 else "ok")
            table_rows.append([short(e["tensor"], 28), e["op_type"], fmt(s["abs_max"]), room, flag,
                               mini_spark(hist, 12)])
        _fill(head_t, ["tensor", "op", "|x| max", "fp16 room", "fp16", "log2 |x|"], table_rows)
        head_t.border_title = "FP16 headroom per tensor (tightest first)"
        head_t.remove_class("hidden")
        spark.remove_class("hidden")
        self.show_tensor(0)

    def show_tensor(self, i: int) -> None:
        from bisect_tui.tui.widgets.common import LabeledSparkline

        if not self._rows:
            return
        i = min(max(i, 0), len(self._rows) - 1)
        e = self._rows[i]["e"]
        counts = clip_hist(e["stats"]["log2_hist"], SPARK_LO, SPARK_HI, LOG2_LO)
        self.query_one("#range-spark", LabeledSparkline).set(
            f"|x| of {short(e['tensor'], 40)} on a log2 scale",
            counts, "<2^-25: 0 in fp16", "2^16+: fp16 overflow",
        )

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "headroom-table":
            event.stop()
            self.show_tensor(event.cursor_row)


def _nonzero_span(hists: list[list[int]]) -> tuple[int, int]:
    lo, hi = None, None
    for h in hists:
        for i, c in enumerate(h):
            if c:
                lo = i if lo is None else min(lo, i)
                hi = i if hi is None else max(hi, i)
    if lo is None:
        return 0, 0
    return lo, hi


class SettingsView(StepView):
    step = "settings"

    def compose_body(self) -> ComposeResult:
        yield Static("", classes="view-text", id="settings-text")

    def render_body(self, st: TriageState) -> None:
        o = st.options
        c = o.config
        entries = ", ".join(f"{k}={v}" for k, v in c.config_entries) or "(none)"
        lines = [
            f"engine:      {o.engine} (ONNX Runtime, CPU)" if o.engine == "ort" else f"engine: {o.engine}",
            f"level:       {c.level}",
            f"precision:   {c.precision}",
            f"config:      {entries}",
            f"disabled:    {', '.join(c.disabled_passes) or '(none)'}",
            f"tolerance:   {o.tolerance.default.describe()}",
        ]
        for pat, tol in o.tolerance.overrides:
            lines.append(f"  {pat}: {tol.describe()}")
        if o.topk:
            lines.append(f"top-k:       {o.topk}")
        lines += ["", "Press o to edit these settings; r confirms them as they are."]
        if st.options_dirty:
            lines.append("Changed since the last comparison: the comparison runs again.")
        self.query_one("#settings-text", Static).update(T("\n".join(lines)))


class ComparisonView(StepView):
    step = "fused"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._names: list[str] = []
        self._fused: Optional[dict] = None

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
        c = f["config"]
        entries = ", ".join(f"{k}={v}" for k, v in (c.get("config_entries") or {}).items())
        n_fail = len(f["failing_outputs"])
        verdict = ("✔ PASS: every output within tolerance" if f["passed"]
                   else f"✘ FAIL: {n_fail} of {len(f['outputs'])} output(s) break tolerance; press b to bisect")
        if f.get("error"):  # the engine did not build or run while the baseline did
            verdict = (f"✘ FAIL ({f['error']['kind']}): the fused engine "
                       + ("does not build" if f["error"]["kind"] == "build_error" else "fails while running")
                       + f": {f['error']['message']}; press b to bisect")
        sens = f.get("sensitivity") or {}
        sens_line = ""
        if sens.get("amplifies"):
            sens_line = (f"\n⚠ sensitivity: a 1-ulp input change moves the FP32 outputs to x{fmt(sens['ratio'])} "
                         "of the tolerance: the model amplifies rounding, every fusion may look guilty")
        sh = f.get("shared_tensors") or {}
        if sh.get("first_failing_tensor"):
            sens_line += f"\nfirst tensor out of tolerance inside the fused graph: {sh['first_failing_tensor']}"
        text.update(T(
            f"engine {f['engine']} level={c['level']} precision={c['precision']}"
            + (f" {entries}" if entries else "")
            + (f" disabled={','.join(c.get('disabled_optimizers') or [])}" if c.get("disabled_optimizers") else "")
            + f"\n{len(f['fused_nodes'])} fused node(s) of {f['optimized_nodes']} in the optimized graph "
            f"({f['original_nodes']} original)\n{verdict}" + sens_line
        ))
        self._names = list(f["outputs"])
        rows = []
        for name, o in f["outputs"].items():
            m = o["metrics"]
            failed = ", ".join(o["verdict"].get("failed", [])) or "-"
            rows.append([short(name, 24), verdict_word(o["passed"]), failed, fmt(m["max_abs"]),
                         fmt(m["mean_abs"]), fmt(m["max_rel"]), fmt(m["cosine"], 6), fmt(m["snr_db"]),
                         ratio(o["verdict"].get("ratio"))])
        table.border_title = "Outputs"
        _fill(table, ["output", "verdict", "failed", "max abs", "mean abs", "max rel", "cosine",
                      "SNR dB", "x tol"], rows, title="Outputs: fused engine vs baseline",
              optional=("mean abs", "SNR dB", "max rel"))
        for w in widgets:
            w.remove_class("hidden")
        self.query_one("#cmp-profile").show(self.profile(st))
        first_fail = next((i for i, n in enumerate(self._names) if not f["outputs"][n]["passed"]), 0)
        if first_fail:
            table.move_cursor(row=first_fail)
        self.show_output(first_fail)

    def profile(self, st: TriageState):
        """The error along the graph, with the culprit's tensors once the search found them."""
        from bisect_tui.core.plots import ErrorProfile, culprit_tensors

        if not st.fused:
            return None
        return ErrorProfile.from_summary(st.fused.get("shared_tensors"), culprit_tensors(st.bisect.result))

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
        o = self._fused["outputs"][name]
        m = o["metrics"]
        tol = o.get("tolerance", {})
        within = m.get("within_0.1pct")
        self.query_one("#cmp-detail", Static).update(T(
            f"{name}: {o['summary']}\ntolerance {tol.get('name', '')}"
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
            from bisect_tui.core.report import BISECT_VERDICT

            mark = {"culprits": "✔ found:", "pass": "✔"}.get(r["verdict"], "?")
            lines.append(f"{mark} {BISECT_VERDICT.get(r['verdict'], r['verdict'])} ({r['engine_builds']} engine builds"
                         + (f", {r.get('reused_steps')} steps reused" if r.get("reused_steps") else "") + ")")
            for i, c in enumerate(r["culprits"], 1):
                lines.append(f"culprit {i}: {c['op_type']} from {', '.join(c['optimizers']) or '?'}")
                lines.append(f"  replaces {', '.join(c['original_nodes'])}")
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


VIEWS = {
    "inputs": InputsView,
    "baseline": BaselineView,
    "determinism": DeterminismView,
    "range_check": RangeView,
    "settings": SettingsView,
    "fused": ComparisonView,
    "bisect": BisectSummaryView,
}
