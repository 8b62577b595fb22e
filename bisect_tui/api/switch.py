"""What the search asks an engine to vary between builds (`Switch`), checked
against what the engine declares it can vary (`Capabilities`).

Its own module, not capabilities.py: every command reads the engines'
declarations (the CLI's flags), while a switch is made only by a search."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bisect_tui.api.capabilities import Capabilities
    from bisect_tui.api.config import EngineConfig


@dataclass(frozen=True)
class Switch:
    """What the search varies between builds, as one object. Engines ignore
    nothing silently: a part their capabilities lack raises `ValueError`."""

    marks: tuple[str, ...] = ()
    keep_high_precision: tuple[str, ...] = ()
    disabled_passes: tuple[str, ...] = ()

    def check(self, caps: Capabilities) -> None:
        if self.marks and not caps.marking:
            raise ValueError("this engine cannot mark tensors")
        if self.disabled_passes and not caps.pass_switches:
            raise ValueError("this engine has no pass switches")
        if self.keep_high_precision and not caps.keep_high_precision:
            raise ValueError("this engine cannot keep nodes in high precision")

    def apply(self, config: "EngineConfig") -> "EngineConfig":
        """The config a build with this switch uses (marks travel separately)."""
        cfg = config
        if self.disabled_passes:
            cfg = cfg.with_disabled(self.disabled_passes)
        if self.keep_high_precision:
            cfg = cfg.with_keep_fp32(set(cfg.keep_fp32) | set(self.keep_high_precision))
        return cfg
