"""What an engine's repro script is written from (`Engine.write_repro`).

Its own module, not graph.py: every build reads the fused-node records, while
a repro is written only for a bundle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class ReproSpec:
    """What an engine's repro script needs, all data (names are never code:
    the script text is constant and reads them from its JSON)."""

    model_file: str  # relative to the bundle
    inputs_file: str  # .npz, relative to the bundle
    config: dict  # EngineConfig.to_dict()
    outputs: list[str]
    tolerance: dict  # per output: {"atol": ..., "rtol": ..., "min_cosine": ...}
    reference: dict  # {"file": .npz, "name": what computed it}
    workaround: Optional[dict] = None  # the proven workaround, engine-shaped
    extra: dict = field(default_factory=dict)
