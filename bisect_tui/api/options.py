"""The settings an engine declares, one declaration per setting.

One `EngineOption` drives the CLI flag (engines/flags.py), the app's settings
form, validation, the report's settings lines and the session key, so a new
engine's settings need no code outside its own package (harlequin's adapter
options are the model)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from bisect_tui.api.config import EngineConfig


@dataclass(frozen=True)
class EngineOption:
    """One setting an engine declares.

    `field` says where the value lives in `EngineConfig`: one of its fields
    (`level`, `config_entries`, `disabled_passes`) or `options.<name>` for an
    engine-specific value kept in `EngineConfig.options`.
    `kind`: "choice" (one of `choices`), "text", "list" (repeatable, e.g. pass
    names), "mapping" (repeatable KEY=VALUE). `flag` is the CLI flag.
    `ordered`: a list whose order matters (kept as given, not sorted)."""

    name: str
    kind: str
    default: Any
    help: str
    flag: str
    field: str
    choices: tuple[str, ...] = ()
    metavar: Optional[str] = None
    label: str = ""  # the settings form's label; `name` when empty
    form_id: str = ""  # the settings form's widget id; `opt-<name>` when empty
    placeholder: str = ""  # the settings form's hint in an empty field
    in_form: bool = True  # False: CLI only (e.g. values that depend on the machine)
    ordered: bool = False
    normalized: bool = False  # the engine rewrites the value (`EngineBase.normalize_option`)
    # "tensor": each value names a tensor of the model, checked once the model is
    # read (a name that matches nothing stops the run with "did you mean")
    names: str = ""
    # values the engine adds by itself (a fallback every such list ends with):
    # a command line written back for the user leaves them out
    implied: tuple[str, ...] = ()

    @property
    def widget_id(self) -> str:
        return self.form_id or f"opt-{self.name}"

    @property
    def option_key(self) -> Optional[str]:
        """The key in `EngineConfig.options`, or None for a field of its own."""
        return self.field[len("options."):] if self.field.startswith("options.") else None

    def config_value(self, config: "EngineConfig") -> Any:
        key = self.option_key
        if key is not None:
            return dict(config.options).get(key, self.default)
        return getattr(config, self.field)

    def encode(self, value: Any) -> str:
        """The string an `options.<name>` value is kept as (lists as JSON)."""
        if self.kind == "list":
            return json.dumps(list(value) if self.ordered else sorted(set(value)))
        if self.kind == "mapping":
            return json.dumps(dict(value), sort_keys=True)
        return str(value)
