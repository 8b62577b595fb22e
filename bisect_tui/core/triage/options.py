"""What a triage was asked to do, and its round trip through session.json.

Kept apart from the steps that do the work so that the CLI, the app's forms and
`resume` can build, compare and save options without loading any step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bisect_tui.core.tolerance import ToleranceSpec, parse_tolerance
from bisect_tui.api import EngineConfig


@dataclass
class TriageOptions:
    model: Optional[Path]  # None until a torch front end has exported the model
    session_dir: Optional[Path] = None
    shapes: dict[str, list[int]] = field(default_factory=dict)
    seed: int = 0
    samples: int = 1
    input_file: Optional[Path] = None
    input_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    input_values: dict[str, Any] = field(default_factory=dict)  # --input-value: one value fills the input
    max_memory: int = 0  # 0 = derived from free RAM
    engine: str = "ort"
    config: EngineConfig = field(default_factory=EngineConfig)
    tolerance: ToleranceSpec = field(default_factory=lambda: parse_tolerance("fp32"))
    ranges: list[tuple[str, float, float]] = field(default_factory=list)
    check_determinism: bool = True
    topk: Optional[int] = None
    compare_tensors: bool = True  # also compare every tensor the fused graph keeps
    torch: Optional[dict] = None  # TorchSpec.to_dict(): the model comes from a PyTorch factory
    arbiter: bool = True  # judge baseline and fused outputs against a float64 run of the model

    def input_options(self) -> dict:
        if self.input_file:
            from bisect_tui.core.model import file_sha256

            return {"input_file": str(Path(self.input_file).resolve()),
                    "input_sha256": file_sha256(Path(self.input_file)),
                    "shapes": self.shapes}
        out = {"seed": self.seed, "samples": self.samples, "shapes": self.shapes,
               "input_ranges": {k: list(v) for k, v in self.input_ranges.items()}}
        if self.input_values:  # only when given: sessions made before the option stay valid
            out["input_values"] = dict(self.input_values)
        return out

    def inputs_are_default(self) -> bool:
        """Generated with the defaults: the session directory keeps the model's plain name."""
        return (not self.input_file and not self.shapes and self.seed == 0 and self.samples == 1
                and not self.input_ranges and not self.input_values)

    def to_dict(self) -> dict:
        """Everything needed to rerun this triage (saved in session.json for `resume`)."""
        return {
            "model": str(Path(self.model).resolve()) if self.model else None,
            "session_dir": str(self.session_dir) if self.session_dir else None,
            "shapes": self.shapes,
            "seed": self.seed,
            "samples": self.samples,
            "input_file": str(self.input_file) if self.input_file else None,
            "input_ranges": {k: list(v) for k, v in self.input_ranges.items()},
            "input_values": dict(self.input_values),
            "max_memory": self.max_memory,
            "engine": self.engine,
            "config": self.config.to_dict(),
            "tolerance": self.tolerance.to_dict(),
            "ranges": [list(r) for r in self.ranges],
            "check_determinism": self.check_determinism,
            "topk": self.topk,
            "compare_tensors": self.compare_tensors,
            "torch": self.torch,
            "arbiter": self.arbiter,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "TriageOptions":
        return cls(
            model=Path(d["model"]) if d.get("model") else None,
            session_dir=Path(d["session_dir"]) if d.get("session_dir") else None,
            shapes={k: list(v) for k, v in (d.get("shapes") or {}).items()},
            seed=int(d.get("seed", 0)),
            samples=int(d.get("samples", 1)),
            input_file=Path(d["input_file"]) if d.get("input_file") else None,
            input_ranges={k: tuple(v) for k, v in (d.get("input_ranges") or {}).items()},
            input_values=dict(d.get("input_values") or {}),
            max_memory=int(d.get("max_memory") or 0),
            engine=d.get("engine", "ort"),
            config=EngineConfig.from_dict(d.get("config") or {}),
            tolerance=ToleranceSpec.from_dict(d["tolerance"]) if d.get("tolerance") else parse_tolerance("fp32"),
            ranges=[tuple(r) for r in d.get("ranges") or []],
            check_determinism=bool(d.get("check_determinism", True)),
            topk=d.get("topk"),
            compare_tensors=bool(d.get("compare_tensors", True)),
            torch=d.get("torch"),
            arbiter=bool(d.get("arbiter", True)),
        )
