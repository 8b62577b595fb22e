"""Settings form: the inputs (shapes, fixed values, an input file, seed, samples),
the engine (level, precision, config entries, disabled optimizers) and the tolerance.

Returns new TriageOptions with `dismiss(options)`, or None when cancelled.
Every value is validated here (optimizer names against the installed engine)
so a typo is a one-line message in the form, never a silently ignored option.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Optional

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from pathlib import Path

from bisect_tui.core.errors import UserError
from bisect_tui.core.inputs import parse_input_values, parse_shapes, value_text
from bisect_tui.core.pipeline import TriageOptions
from bisect_tui.core.tolerance import PRESETS, ToleranceSpec, parse_tolerance
from bisect_tui.engines.registry import declaration


def parse_entries(text: str) -> tuple[tuple[str, str], ...]:
    out = []
    for item in text.replace(";", ",").replace(" ", ",").split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise UserError(f"config entry {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        if not k.strip():
            raise UserError(f"config entry {item!r}: empty key")
        out.append((k.strip(), v.strip()))
    return tuple(sorted(out))


def split_items(text: str) -> list[str]:
    """`x=1x3x224x224, batch=1` or `x=1x3x224x224 batch=1` -> one item each."""
    return [t for t in text.replace(";", ",").replace(" ", ",").split(",") if t.strip()]


def shapes_text(shapes: dict) -> str:
    return ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())


def values_text(values: dict) -> str:
    return ", ".join(f"{k}={value_text(v)}" for k, v in values.items())


def _int(label: str, text: str, default: int, low: int = 0) -> int:
    t = text.strip()
    if not t:
        return default
    try:
        v = int(t)
    except ValueError:
        raise UserError(f"{label} {t!r} is not a whole number") from None
    if v < low:
        raise UserError(f"{label} must be at least {low}, got {v}")
    return v


def parse_names(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.replace(";", ",").replace(" ", ",").split(",")]
    return tuple(dict.fromkeys(n for n in names if n))


def _option_list(value) -> list[str]:
    """A list option's current value: a tuple field, or the JSON list kept in `options`."""
    if isinstance(value, str):
        import json

        try:
            loaded = json.loads(value)
        except ValueError:
            return [value]
        return [str(v) for v in loaded] if isinstance(loaded, list) else [str(loaded)]
    return [str(v) for v in (value or ())]


def _float(label: str, text: str) -> Optional[float]:
    t = text.strip()
    if not t:
        return None
    try:
        return float(t)
    except ValueError:
        raise UserError(f"{label} {t!r} is not a number (leave it empty for the preset's value)") from None


def _preset_of(spec: ToleranceSpec) -> tuple[str, dict[str, str]]:
    """The preset the current tolerance starts from, and the fields that differ from it."""
    tol = spec.default
    base = tol.name.split("+", 1)[0]
    if base not in PRESETS:
        base = "fp32"
    if tol.name == base:
        return base, {}
    return base, {k: ("" if getattr(tol, k) is None else f"{getattr(tol, k):g}")
                  for k in ("atol", "rtol", "min_cosine")}


class SettingsScreen(ModalScreen[Optional[TriageOptions]]):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        # q closes the form instead of quitting the app (inputs still type a q)
        Binding("q", "cancel", "Cancel", show=False),
    ]

    DEFAULT_CSS = """
    SettingsScreen { align: center middle; }
    SettingsScreen #form {
        width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; padding: 0 1; background: $surface;
    }
    SettingsScreen .row { height: auto; margin-bottom: 0; }
    SettingsScreen .row > Label { width: 16; padding-top: 0; }
    SettingsScreen .section { height: 1; text-style: bold; }
    SettingsScreen #suggestion { height: auto; color: $text-warning; }
    SettingsScreen .row > Input, SettingsScreen .row > Select { width: 1fr; }
    SettingsScreen #preset-desc { height: auto; color: $text-muted; margin-bottom: 1; }
    SettingsScreen #form-error { height: auto; color: $text-error; text-style: bold; }
    SettingsScreen #buttons { height: auto; margin-top: 1; }
    SettingsScreen #buttons Button { margin-right: 2; }
    """

    def __init__(self, options: TriageOptions, suggestion=None) -> None:
        super().__init__()
        self.options = options
        self.suggestion = suggestion  # input_suggest.Suggestion: prefills what the model needs
        self._known: Optional[set[str]] = None

    def compose(self) -> ComposeResult:
        o = self.options
        preset, custom = _preset_of(self.options.tolerance)
        shapes, values = dict(o.shapes), dict(o.input_values)
        sug = self.suggestion
        if sug is not None:
            shapes = {**sug.shapes, **shapes}
            values = {**sug.values, **values}
        with VerticalScroll(id="form") as form:
            form.border_title = "Settings (enter applies, escape cancels)"
            yield Static("Inputs", classes="section")
            if sug is not None:
                yield Static(Text("suggested for this model's dynamic inputs"
                                  + (f" ({'; '.join(sug.reasons)})" if sug.reasons else "")
                                  + ("; it ran in a quick probe" if sug.probe == "ran" else "")), id="suggestion")
            with Horizontal(classes="row"):
                yield Label("shapes")
                yield Input(shapes_text(shapes), id="shapes", compact=True,
                            placeholder="e.g. x=1x3x224x224, batch=1 (an input or a dim name)")
            with Horizontal(classes="row"):
                yield Label("fixed values")
                yield Input(values_text(values), id="values", compact=True,
                            placeholder="e.g. sr=16000 (one value fills the input)")
            with Horizontal(classes="row"):
                yield Label("input file")
                yield Input(str(o.input_file or ""), id="input-file", compact=True,
                            placeholder=".npy/.npz with the exact inputs (empty: generated)")
            with Horizontal(classes="row"):
                yield Label("seed / samples")
                yield Input(str(o.seed), id="seed", compact=True, placeholder="0")
                yield Input(str(o.samples), id="samples", compact=True, placeholder="1")
            yield Static("Engine", classes="section")
            yield from self._engine_rows()
            yield Static("Tolerance", classes="section")
            with Horizontal(classes="row"):
                yield Label("preset")
                yield Select([(name, name) for name in PRESETS], value=preset, allow_blank=False,
                             id="preset", compact=True)
            yield Static("", id="preset-desc")
            for key, label in (("atol", "atol"), ("rtol", "rtol"), ("min_cosine", "min cosine")):
                with Horizontal(classes="row"):
                    yield Label(label)
                    yield Input(custom.get(key, ""), id=key, placeholder="(preset value)", compact=True)
            yield Static("", id="form-error")
            with Horizontal(id="buttons"):
                yield Button("Apply", id="apply", variant="primary", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def _form_options(self) -> list:
        """The engine's declared options shown here, with the common precision
        after the first of them (ORT: level, precision, config entries, disable)."""
        opts = [o for o in declaration(self.options.engine).OPTIONS if o.in_form]
        return opts[:1] + [None] + opts[1:]

    def _engine_rows(self):
        c = self.options.config
        for opt in self._form_options():
            with Horizontal(classes="row"):
                if opt is None:
                    yield Label("precision")
                    yield Select([(p, p) for p in declaration(self.options.engine).CAPABILITIES.precisions],
                                 value=c.precision, allow_blank=False, id="precision", compact=True)
                    continue
                yield Label(opt.label or opt.name)
                value = opt.config_value(c)
                if opt.kind == "choice":
                    yield Select([(v, v) for v in opt.choices], value=value, allow_blank=False,
                                 id=opt.widget_id, compact=True)
                    continue
                if opt.kind == "mapping":
                    text = ", ".join(f"{k}={v}" for k, v in value)
                elif opt.kind == "list":
                    text = ", ".join(_option_list(value))
                else:
                    text = "" if value in (None, opt.default) else str(value)
                yield Input(text, id=opt.widget_id, placeholder=opt.placeholder, compact=True)

    def _engine_values(self) -> dict:
        """Raw values of the engine rows, by option name (engines/flags.option_fields parses them)."""
        values: dict = {}
        for opt in self._form_options():
            if opt is None:
                continue
            if opt.kind == "choice":
                values[opt.name] = str(self.query_one(f"#{opt.widget_id}", Select).value)
                continue
            text = self.query_one(f"#{opt.widget_id}", Input).value
            if opt.kind == "mapping":
                values[opt.name] = [f"{k}={v}" for k, v in parse_entries(text)]
            elif opt.kind == "list":
                values[opt.name] = list(parse_names(text))
            else:
                values[opt.name] = text.strip() or None
        return values

    def on_mount(self) -> None:
        self._describe_preset()
        first = next(o.widget_id for o in self._form_options() if o is not None)
        self.query_one("#shapes" if self.suggestion is not None else "#" + first).focus()
        self._load_known()

    @work(thread=True, exclusive=True, group="known-optimizers", exit_on_error=False)
    def _load_known(self) -> None:
        from bisect_tui.engines.registry import get_engine

        try:
            known = get_engine(self.options.engine).known_passes()
        except Exception:
            known = None
        self.app.call_from_thread(self._set_known, known)

    def _set_known(self, known: Optional[set[str]]) -> None:
        self._known = known

    def _describe_preset(self) -> None:
        name = self.query_one("#preset", Select).value
        p = PRESETS.get(str(name))
        if p:
            self.query_one("#preset-desc", Static).update(
                Text(f"{p.tolerance.describe()}\n{p.description}"))

    @on(Select.Changed, "#preset")
    def _preset_changed(self) -> None:
        self._describe_preset()

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.apply()

    @on(Button.Pressed, "#apply")
    def _apply_pressed(self) -> None:
        self.apply()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def error(self, text: str) -> None:
        self.query_one("#form-error", Static).update(Text(text))

    def build(self) -> TriageOptions:
        """The options the form describes; UserError (one line) when a value is wrong."""
        from bisect_tui.engines.flags import option_fields

        decl = declaration(self.options.engine)
        values = self._engine_values()
        precision = str(self.query_one("#precision", Select).value)
        disabled = tuple(values.get("disable") or ()) if any(
            o.field == "disabled_passes" for o in decl.OPTIONS) else ()
        if disabled:
            known = self._known
            if known is None:
                from bisect_tui.engines.registry import get_engine

                known = get_engine(self.options.engine).known_passes()
                self._known = known
            unknown = [n for n in disabled if n not in known]
            if unknown:
                hints = difflib.get_close_matches(unknown[0], sorted(known), n=3)
                raise UserError(
                    f"{unknown[0]}: the installed engine does not know this optimizer and would "
                    f"silently ignore it" + (f"; did you mean {', '.join(hints)}?" if hints else ""))
        fields, engine_options = option_fields(decl, values)
        preset = str(self.query_one("#preset", Select).value)
        tol = parse_tolerance(
            preset,
            _float("atol", self.query_one("#atol", Input).value),
            _float("rtol", self.query_one("#rtol", Input).value),
            _float("min cosine", self.query_one("#min_cosine", Input).value),
        )
        spec = ToleranceSpec(default=tol.default, overrides=self.options.tolerance.overrides)
        kept = {k: v for k, v in self.options.config.options if k not in
                {o.field[len("options."):] for o in decl.OPTIONS if o.in_form and o.field.startswith("options.")}}
        # replace, not rebuild: settings the form does not show (keep-fp32 nodes, providers) stay
        config = dataclasses.replace(self.options.config, precision=precision,
                                     options=tuple(sorted({**kept, **engine_options}.items())), **fields)
        from bisect_tui.engines.registry import get_engine

        get_engine(self.options.engine).validate(config)  # what the installed engine would ignore
        shapes = parse_shapes(split_items(self.query_one("#shapes", Input).value))
        values = parse_input_values(split_items(self.query_one("#values", Input).value))
        file_text = self.query_one("#input-file", Input).value.strip()
        input_file = Path(file_text).expanduser() if file_text else None
        if input_file is not None and not input_file.is_file():
            raise UserError(f"input file not found: {input_file}")
        seed = _int("seed", self.query_one("#seed", Input).value, 0)
        samples = _int("samples", self.query_one("#samples", Input).value, 1, low=1)
        return dataclasses.replace(self.options, config=config, tolerance=spec, shapes=shapes,
                                   input_values=values, input_file=input_file, seed=seed, samples=samples)

    def apply(self) -> None:
        try:
            opts = self.build()
        except UserError as exc:
            self.error(f"error: {exc}")
            self.app.bell()
            return
        self.dismiss(opts)
