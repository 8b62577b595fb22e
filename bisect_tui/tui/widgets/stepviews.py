"""The detail pane of each checklist step. Each view renders from the app's
TriageState, with the report's own lines where it says the same thing."""

from __future__ import annotations

import math

from textual.app import ComposeResult
from textual.widgets import DataTable, ProgressBar, Static

from bisect_tui.core.report import determinism_line, range_lines
from bisect_tui.core.report.sections import baseline_how
from bisect_tui.core.stats import FP16_MAX, LOG2_LO
from bisect_tui.tui.format import clip_hist, fmt, mb, mini_spark, short, show_path
from bisect_tui.tui.state import TriageState
from bisect_tui.tui.widgets.comparison import BisectSummaryView, ComparisonView
from bisect_tui.tui.widgets.stepview import MAX_ROWS, StepView, T, _fill

SPARK_LO, SPARK_HI = -26, 16  # log2 range of the headroom sparkline: FP16 zero .. FP16 overflow


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
                f"{baseline_how(opts)}"
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
            text.update(T("Runs the model with every optimization off, FP32 on CPU, "
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
        if d.advice:
            line += "\n" + d.advice
        text.update(T(line))
        if d.differing:
            _fill(table, ["#", "tensor", "node", "op"],
                  [[e["index"], e["tensor"], e["node"], e["op_type"]] for e in d.differing[:MAX_ROWS]])
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
        origin = rc.nan_inf_origin
        if origin:
            lines.append(origin["advice"])
        text.update(T("\n".join(lines)))
        if rc.nan_inf:
            _fill(nan_t, ["tensor", "op", "NaN", "Inf", "elements"],
                  [[e["tensor"], e["op_type"], e["nan"], e["inf"], e["numel"]] for e in rc.nan_inf[:MAX_ROWS]])
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


def engine_lines(engine: str, config) -> list[tuple[str, str]]:
    """The engine's own words for its settings (its describe(), as in the report),
    or the common ones when the engine cannot be loaded here."""
    from bisect_tui.engines.registry import get_engine

    try:
        return list(get_engine(engine).describe(config))
    except Exception:  # a missing library: the form and the CLI say why; here the plain values
        return [("level", config.level), ("precision", config.precision)]


class SettingsView(StepView):
    step = "settings"

    def compose_body(self) -> ComposeResult:
        yield Static("", classes="view-text", id="settings-text")

    def render_body(self, st: TriageState) -> None:
        o = st.options
        c = o.config
        rows = engine_lines(o.engine, c)
        head = rows.pop(0)[1] if rows and rows[0][0] == "engine" else ""
        lines = [f"engine:      {o.engine}" + (f" ({head})" if head else "")]
        lines += [f"{label + ':':<12} {value}" for label, value in rows]
        lines.append(f"tolerance:   {o.tolerance.default.describe()}")
        for pat, tol in o.tolerance.overrides:
            lines.append(f"  {pat}: {tol.describe()}")
        if o.topk:
            lines.append(f"top-k:       {o.topk}")
        lines += ["", "Press o to edit these settings; r confirms them as they are."]
        if st.options_dirty:
            lines.append("Changed since the last comparison: the comparison runs again.")
        self.query_one("#settings-text", Static).update(T("\n".join(lines)))


VIEWS = {
    "inputs": InputsView,
    "baseline": BaselineView,
    "determinism": DeterminismView,
    "range_check": RangeView,
    "settings": SettingsView,
    "fused": ComparisonView,
    "bisect": BisectSummaryView,
}
