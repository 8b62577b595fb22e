"""Model picker: recent sessions first, then .onnx files under the working directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, OptionList, Static
from textual.widgets.option_list import Option

from bisect_tui.tui.format import show_path
from bisect_tui.tui.widgets.common import StatusLine

SKIP_DIRS = {"node_modules", "__pycache__", "site-packages", "bisect-sessions", "build", "dist"}
MAX_DEPTH = 3
MAX_MODELS = 100


def find_models(root: Path) -> list[Path]:
    """.onnx files under `root` (a few levels deep), skipping hidden dirs, venvs and sessions."""
    found: list[Path] = []
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        depth = len(d.relative_to(root).parts)
        if (d / "session.json").exists():  # a session's prepared copy is not a model to pick
            dirnames[:] = []
            continue
        dirnames[:] = sorted(
            n for n in dirnames
            if not n.startswith(".") and n not in SKIP_DIRS and depth < MAX_DEPTH
            and not (d / n / "pyvenv.cfg").exists()
        )
        for f in sorted(filenames):
            if f.lower().endswith(".onnx"):
                found.append(d / f)
                if len(found) >= MAX_MODELS:
                    break
        if len(found) >= MAX_MODELS:
            break
    return sorted(found, key=lambda p: (len(p.relative_to(root).parts), str(p)))


class Picked(Message):
    def __init__(self, options, resume: bool) -> None:
        super().__init__()
        self.options = options
        self.resume = resume


class PickSuggest(Message):
    """The model needs shapes or values: the picker fills the options field."""

    def __init__(self, path: Path, flags: str, text: str) -> None:
        super().__init__()
        self.path = path
        self.flags = flags
        self.text = text


class PickFailed(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class PickerScreen(Screen):
    """Choose a model (or a session to resume); a bad path is one line, never a crash."""

    DEFAULT_CSS = """
    PickerScreen #picker { height: 1fr; padding: 0 1; }
    PickerScreen #intro { height: auto; margin-bottom: 1; }
    PickerScreen #path { margin-bottom: 0; }
    PickerScreen #flags { margin-bottom: 1; }
    PickerScreen #choices { height: 1fr; border: round $primary-darken-2; }
    PickerScreen #choices:focus { border: round $primary; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.sub_title = "open a model"
        self._ids: dict[str, tuple[str, Path]] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="picker"):
            yield Static(Text(
                "Pick an ONNX model to triage, or a recent session to resume. Type a path and press "
                "enter, or choose below with up/down and enter."), id="intro")
            yield Input(placeholder="path to a .onnx model or a session directory", id="path")
            yield Input(placeholder="input options, as on the command line: --shape x=1x3x224x224 "
                                    "--input-value sr=16000 --input data.npz", id="flags")
            yield OptionList(id="choices")
        yield StatusLine(id="status")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.reload()

    def reload(self) -> None:
        from bisect_tui.core.session import recent_sessions

        choices = self.query_one("#choices", OptionList)
        choices.clear_options()
        self._ids.clear()
        opts: list[Option] = []
        recent = recent_sessions()
        if recent:
            opts.append(Option(Text("Recent sessions", style="bold"), disabled=True))
            for i, e in enumerate(recent[:20]):
                oid = f"s{i}"
                self._ids[oid] = ("session", Path(e["session"]))
                model = Path(e.get("model") or "?").name
                opts.append(Option(Text(f"  ↺ {show_path(e['session'])}  ({model})"), id=oid))
        models = find_models(Path.cwd())
        opts.append(Option(Text("Models under the working directory", style="bold"), disabled=True))
        if not models:
            opts.append(Option(Text("  (no .onnx file found: type a path above)"), disabled=True))
        for i, m in enumerate(models):
            oid = f"m{i}"
            self._ids[oid] = ("model", m)
            opts.append(Option(Text(f"  {show_path(m)}"), id=oid))
        choices.add_options(opts)
        if self._ids:
            choices.highlighted = next(i for i, o in enumerate(opts) if not o.disabled)
            choices.focus()
        else:
            self.query_one("#path", Input).focus()
        status = self.query_one(StatusLine)
        status.show(f"{len(recent)} recent session(s), {len(models)} model(s) found")

    # -- choosing -----------------------------------------------------------------
    @on(OptionList.OptionSelected, "#choices")
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        kind, path = self._ids.get(event.option.id or "", (None, None))
        if kind:
            self.open_path(path, kind)

    @on(Input.Submitted, "#flags")
    def _flags_typed(self, event: Input.Submitted) -> None:
        text = self.query_one("#path", Input).value.strip()
        if not text:
            choices = self.query_one("#choices", OptionList)
            opt = choices.get_option_at_index(choices.highlighted) if choices.highlighted is not None else None
            kind, path = self._ids.get((opt.id if opt else "") or "", (None, None))
            if kind == "model":
                self.open_path(path, kind)
                return
        self._typed(Input.Submitted(self.query_one("#path", Input), text))

    @on(Input.Submitted, "#path")
    def _typed(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            self.fail("type a path to a .onnx model or a session directory")
            return
        from bisect_tui.frontends.torch import looks_like_spec

        if looks_like_spec(text):  # a PyTorch factory, as --torch takes it
            self.query_one(StatusLine).show(f"importing {text}...")
            self._check(Path(text), "torch")
            return
        self.open_path(Path(os.path.expanduser(text)), None)

    def fail(self, text: str) -> None:
        self.query_one(StatusLine).show(f"error: {text}", error=True)
        self.app.bell()

    def open_path(self, path: Path, kind: Optional[str]) -> None:
        if not path.exists():
            self.fail(f"not found: {path}")
            return
        if kind is None:
            if path.is_dir():
                if not (path / "session.json").exists():
                    self.fail(f"{path} is a directory but not a bisect-tui session (no session.json)")
                    return
                kind = "session"
            else:
                kind = "model"
        self.query_one(StatusLine).show(f"checking {show_path(path)}...")
        self._check(path, kind, self.query_one("#flags", Input).value)

    @work(thread=True, exclusive=True, group="picker", exit_on_error=False)
    def _check(self, path: Path, kind: str, flags: str = "") -> None:
        """Load and validate in a thread: a big model must not freeze the screen.
        A model whose inputs need shapes gets a suggestion (that ran) in the
        options field instead of an error after the checklist opened."""
        from bisect_tui.core.errors import UserError
        from bisect_tui.core.input_suggest import InputsNeedValues

        try:
            if kind == "torch":
                from bisect_tui.core.triage.options import TriageOptions
                from bisect_tui.frontends.torch import TorchSpec
                from bisect_tui.frontends.torch.factory import import_factory

                spec = TorchSpec.parse(str(path))
                import_factory(spec)  # a bad module or name fails here, before the checklist opens
                self.app.post_message(Picked(TriageOptions(model=None, torch=spec.to_dict()), False))
            elif kind == "session":
                from bisect_tui.core.resume import options_from_session
                from bisect_tui.engines.registry import get_engine

                opts = options_from_session(path, get_engine)
                self.app.post_message(Picked(opts, True))
            else:
                from bisect_tui.core.input_suggest import check_config_inputs, resolve_shapes
                from bisect_tui.core.model import load_model_info
                from bisect_tui.core.triage import catalog
                from bisect_tui.options import options_for_input_flags

                opts = options_for_input_flags(path, flags)
                info = load_model_info(path)
                if not opts.input_file:
                    resolve_shapes(info, opts.shapes, opts.input_values, catalog.installed().reference())
                    check_config_inputs(info, opts.input_values, opts.input_ranges)
                self.app.post_message(Picked(opts, False))
        except InputsNeedValues as exc:
            have = flags.strip()
            flags_text = (have + " " if have else "") + " ".join(exc.suggestion.flags())
            self.post_message(PickSuggest(path, flags_text.strip(), str(exc)))
        except UserError as exc:
            self.post_message(PickFailed(str(exc)))
        except Exception as exc:  # anything else is still one line here, never a traceback
            self.post_message(PickFailed(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))

    def on_pick_failed(self, message: PickFailed) -> None:
        self.fail(message.text)

    def on_pick_suggest(self, message: PickSuggest) -> None:
        self.query_one("#path", Input).value = str(message.path)
        flags = self.query_one("#flags", Input)
        flags.value = message.flags
        flags.focus()
        self.query_one(StatusLine).show(
            "this model's inputs need shapes or values: suggested options filled in below (they ran in a quick "
            "probe); edit them or press enter to open", error=True)
        self.notify(message.text[:400], title="inputs", severity="warning", timeout=12)

    def state_changed(self, what: str) -> None:
        pass
