"""Reading a model file for a marked build or the probe's observer, its errors in one line."""

from __future__ import annotations

from pathlib import Path

import onnx

from bisect_tui.api import UserError
from bisect_tui.core.onnx_files import first_line as _first_line


def load_runnable(path: Path) -> onnx.ModelProto:
    """The model as the marked builds need it: weights left in their files when
    it has external data (core/external_data.py), loaded otherwise."""
    from bisect_tui.core.external_data import load

    try:
        return load(path)
    except UserError:
        raise
    except FileNotFoundError:
        raise UserError(f"model file not found: {path}") from None
    except Exception as e:  # DecodeError and friends: not an ONNX file
        raise UserError(f"could not read ONNX model {path}: {_first_line(e)}") from None
