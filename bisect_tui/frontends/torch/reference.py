"""PyTorch's forward hooks as a `core.reference.Reference`.

Tensors are asked for by golden name (`layer_<index>_<module path>`, as the
golden manifest lists them): the same names the session's files carry, so a
caller can recompute any module output on another input."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bisect_tui.frontends.torch import factory
from bisect_tui.frontends.torch.hooks import GoldenRecorder


class TorchHooksReference:
    name = "pytorch forward hooks (FP32, eval mode)"

    def __init__(self, loaded: factory.Loaded):
        self.loaded = loaded

    def run(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]:
        import torch

        rec = GoldenRecorder(self.loaded.module, 1, None, capture=set(tensors))
        with rec, torch.no_grad():
            rec.begin_sample(0)
            self.loaded.module(*factory.feeds_to_args(self.loaded, feeds))
        return {t: rec.captured[t] for t in tensors if t in rec.captured}
