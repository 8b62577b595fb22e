"""The keep-set part of the repro bundle: the whole model (a precision problem
is not in one subgraph), the session's exact inputs, the baseline's outputs,
keepset.json, the control the search checked first, and the engine's script
that builds in reduced precision with or without the keep-set (the engine's
`add_keepset_repro` hands it in, with any constant file it imports).

Node names come from the model, so the script reads them from keepset.json;
nothing from the model is pasted into the script's source.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np

from bisect_tui.core import atomic

MAX_MODEL_BYTES = 64 << 20  # larger models stay out of the zip; the script says where they were

def append_keepset(zip_path: Path, triage, result: dict, version: str, script_name: str, script: str,
                   extra_files: Optional[dict[str, str]] = None) -> None:
    """Append `keepset/` to the bundle zip written by write_bundle, with the
    engine's constant `script` as `keepset/<script_name>` and the engine's
    constant `extra_files` (name -> text: e.g. the converter the script imports)."""
    from bisect_tui.core.baseline import load_tensor

    p = result.get("precision") or {}
    model_path = Path(triage.session.model_path)
    spec = {
        "generated_by": f"bisect-tui {version}",
        "config": result.get("config") or triage.opts.config.to_dict(),
        "keep_fp32": list(p.get("keep_fp32") or []),
        "keep_set_passed": bool(p.get("passed")),
        "engine_error": result.get("engine_error"),
        # "keep every node" against the engine in FP32: the instrument's own proof
        "control": p.get("control"),
        "tolerance": {k: v for k, v in triage.opts.tolerance.default.to_dict().items()
                      if k in ("atol", "rtol")},
    }
    inputs = io.BytesIO()
    np.savez(inputs, **triage.inputs.arrays)
    expected = io.BytesIO()
    np.savez(expected, **{n: np.asarray(load_tensor(triage.session, triage.baseline.manifest, n))
                          for n in triage.info.outputs})
    data = Path(zip_path).read_bytes()
    buf = io.BytesIO(data)
    with zipfile.ZipFile(buf, "a", zipfile.ZIP_DEFLATED) as z:
        if model_path.stat().st_size <= MAX_MODEL_BYTES:
            z.write(model_path, "keepset/model.onnx")
        else:
            spec["model_not_included"] = f"{model_path.stat().st_size} bytes; copy the model here as model.onnx"
        z.writestr("keepset/keepset.json", json.dumps(spec, indent=2))
        z.writestr("keepset/inputs.npz", inputs.getvalue())
        z.writestr("keepset/expected.npz", expected.getvalue())
        z.writestr(f"keepset/{script_name}", script)
        for name, text in (extra_files or {}).items():
            z.writestr(f"keepset/{name}", text)
    atomic.write_bytes(Path(zip_path), buf.getvalue())


__all__ = ["append_keepset"]
