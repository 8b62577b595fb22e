"""What the user asked the fused engine to be: one hashable, JSON-able record.

Only what every engine understands has a field here (level, precision, the
passes to disable, the keep-set, KEY=VALUE settings); an engine's own settings
live in `options`, declared by the engine (`EngineOption`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Collection, Optional

# Options that configs written before engines declared their own options held at
# the top level of their JSON, with the value they had when unset. `to_dict`
# keeps them there so report.json, session.json and every cache key derived from
# a config stay what they were; `from_dict` folds them back into `options`.
TOP_LEVEL_OPTIONS: dict[str, tuple[str, ...]] = {"providers": ("CPUExecutionProvider",)}
# the JSON key of the passes to disable, in configs and workarounds alike (docs/bisect.md's contract)
DISABLED_KEY = "disabled_optimizers"


@dataclass(frozen=True)
class EngineConfig:
    """What the user asked the fused engine to be. Hashable and JSON-able."""

    level: str = "all"
    precision: str = "fp32"
    # the engine's KEY=VALUE settings, checked by the engine (session config
    # entries, compile properties), e.g. ("optimization.enable_gelu_approximation", "1")
    config_entries: tuple[tuple[str, str], ...] = ()
    disabled_passes: tuple[str, ...] = ()
    # original node names kept in FP32 when precision is reduced (the keep-set)
    keep_fp32: tuple[str, ...] = ()
    # engine-specific values declared as `options.<name>` (sorted pairs; lists as JSON)
    options: tuple[tuple[str, str], ...] = ()

    def with_disabled(self, names: Collection[str]) -> "EngineConfig":
        merged = tuple(sorted(set(self.disabled_passes) | set(names)))
        return dataclasses.replace(self, disabled_passes=merged)

    def with_level(self, level: str) -> "EngineConfig":
        return dataclasses.replace(self, level=level)

    def with_keep_fp32(self, names: Collection[str]) -> "EngineConfig":
        return dataclasses.replace(self, keep_fp32=tuple(sorted(set(names))))

    def with_precision(self, precision: str) -> "EngineConfig":
        return dataclasses.replace(self, precision=precision, keep_fp32=())

    def with_options(self, **values: str) -> "EngineConfig":
        merged = {**dict(self.options), **{k: str(v) for k, v in values.items()}}
        return dataclasses.replace(self, options=tuple(sorted(merged.items())))

    def option(self, name: str, default: Optional[str] = None) -> Optional[str]:
        return dict(self.options).get(name, default)

    def option_list(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        """A list option (kept as JSON text), decoded."""
        raw = self.option(name)
        return default if raw is None else tuple(str(v) for v in json.loads(raw))

    def to_dict(self) -> dict:
        opts = dict(self.options)
        d: dict[str, Any] = {"level": self.level, "precision": self.precision,
                             "config_entries": {k: v for k, v in self.config_entries},
                             DISABLED_KEY: tuple(self.disabled_passes)}
        for name, unset in TOP_LEVEL_OPTIONS.items():
            raw = opts.pop(name, None)
            d[name] = tuple(json.loads(raw)) if raw is not None else unset
        if self.keep_fp32:  # absent when empty: keys of existing sessions stay valid
            d["keep_fp32"] = tuple(self.keep_fp32)
        if opts:
            d["options"] = opts
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "EngineConfig":
        ce = d.get("config_entries") or {}
        if isinstance(ce, dict):
            ce = tuple(sorted(ce.items()))
        options = {str(k): str(v) for k, v in (d.get("options") or {}).items()}
        for name, unset in TOP_LEVEL_OPTIONS.items():
            value = d.get(name)
            if value is not None and name not in options and tuple(value) != unset:
                options[name] = json.dumps(list(value))
        return cls(
            level=d.get("level", "all"),
            precision=d.get("precision", "fp32"),
            config_entries=tuple(tuple(x) for x in ce),
            disabled_passes=tuple(d.get(DISABLED_KEY) or d.get("disabled_passes") or ()),
            keep_fp32=tuple(d.get("keep_fp32") or ()),
            options=tuple(sorted(options.items())),
        )

    def key(self) -> str:
        """Stable short hash, used to cache builds in the session directory."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:12]
