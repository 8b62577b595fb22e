"""A tolerance per output: the global one plus per-output overrides, as the
CLI flags give them (`--preset`, `--atol`, `--tol OUTPUT:key=value`).

Bad input is a UserError naming the valid values, never a traceback.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterable, Optional

from bisect_tui.core.errors import UserError
from bisect_tui.core.tolerance.criteria import _INT_FIELDS, CRITERIA, Tolerance
from bisect_tui.core.tolerance.presets import DEFAULT_PRESET, get_preset


@dataclass(frozen=True)
class ToleranceSpec:
    """A global tolerance plus per-output overrides.

    Override patterns are output names; an exact name wins, otherwise the
    first matching shell-style glob (``*/LayerNorm*``) in the given order.
    """

    default: Tolerance
    overrides: tuple[tuple[str, Tolerance], ...] = ()

    def override_pattern(self, name: str) -> Optional[str]:
        """The override that applies to `name`: an exact name wins over globs."""
        for pattern, _ in self.overrides:
            if pattern == name:
                return pattern
        for pattern, _ in self.overrides:
            if fnmatch.fnmatchcase(name, pattern):
                return pattern
        return None

    def for_output(self, name: str) -> Tolerance:
        pattern = self.override_pattern(name)
        return next((tol for p, tol in self.overrides if p == pattern), self.default)

    def unused(self, names: Iterable[str]) -> list[str]:
        """Override patterns that match none of ``names`` (likely typos)."""
        names = list(names)
        return [
            p for p, _ in self.overrides
            if not any(p == n or fnmatch.fnmatchcase(n, p) for n in names)
        ]

    def to_dict(self) -> dict:
        return {
            "default": self.default.to_dict(),
            "overrides": [{"output": p, "tolerance": t.to_dict()} for p, t in self.overrides],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "ToleranceSpec":
        return cls(
            default=Tolerance.from_dict(data["default"]),
            overrides=tuple(
                (o["output"], Tolerance.from_dict(o["tolerance"])) for o in data.get("overrides", ())
            ),
        )


def _parse_value(key: str, text: str, where: str) -> float | int | None:
    t = text.strip()
    if t.lower() in ("none", "off"):
        return None
    try:
        if key in _INT_FIELDS:
            return int(t)
        return float(t)
    except ValueError:
        kind = "an integer" if key in _INT_FIELDS else "a number"
        raise UserError(f"{where}: {key}={text!r} is not {kind} (or 'none')") from None


def _parse_override(text: str, base: Tolerance) -> tuple[str, Tolerance]:
    """``output:key=value,...`` -> (output, tolerance). The last ':' splits, so
    TF-style names like ``dense/BiasAdd:0`` work. Keys apply on top of ``base``
    or, with ``preset=NAME``, on top of that preset."""
    valid = ", ".join(("preset",) + CRITERIA)
    if ":" not in text:
        raise UserError(
            f"bad tolerance override {text!r}; expected OUTPUT:key=value[,key=value] with keys {valid}"
        )
    output, _, body = text.rpartition(":")
    output = output.strip()
    pairs: list[tuple[str, str]] = []
    for item in body.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not output or not eq or not key:
            raise UserError(
                f"bad tolerance override {text!r}; expected OUTPUT:key=value[,key=value] with keys {valid}"
            )
        if key != "preset" and key not in CRITERIA:
            raise UserError(f"unknown tolerance criterion {key!r} in {text!r}; valid: {valid}")
        pairs.append((key, value))
    tol = base
    presets = [v for k, v in pairs if k == "preset"]
    if len(presets) > 1:
        raise UserError(f"tolerance override {text!r} names more than one preset")
    if presets:
        tol = get_preset(presets[0])
    changes = {k: _parse_value(k, v, f"tolerance override {text!r}") for k, v in pairs if k != "preset"}
    if changes:
        if "max_fail_share" in changes and changes["max_fail_share"] is None:
            changes["max_fail_share"] = 0.0
        tol = tol.replace(**changes, name=f"{tol.name}+custom" if tol.name != "custom" else "custom")
    return output, tol


def parse_tolerance(
    preset: str | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
    overrides: Iterable[str] = (),
) -> ToleranceSpec:
    """Build the spec from CLI flags.

    No preset means ``DEFAULT_PRESET`` (fp32). Explicit atol/rtol/min_cosine
    replace the preset's values. Overrides (``logits:atol=1e-3,min_cosine=0.999``
    or ``logits:preset=fp16``) start from the resulting global tolerance unless
    they name a preset. Bad input raises UserError listing the valid values.
    """
    base = get_preset(preset if preset is not None else DEFAULT_PRESET)
    explicit = {k: v for k, v in (("atol", atol), ("rtol", rtol), ("min_cosine", min_cosine)) if v is not None}
    if explicit:
        base = base.replace(**explicit, name=f"{base.name}+custom")
    parsed: dict[str, Tolerance] = {}
    for text in overrides:
        output, tol = _parse_override(text, base)
        if output in parsed:
            raise UserError(f"output {output!r} has more than one tolerance override; merge them")
        parsed[output] = tol
    return ToleranceSpec(default=base, overrides=tuple(parsed.items()))
