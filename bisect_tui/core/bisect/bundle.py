"""The minimal repro bundle: a zip a bug tracker accepts and anyone can run.

It holds the culprit's extracted subgraph, the baseline's own tensors as its
inputs, the unfused FP32 outputs as the expectation (plus the float64 truth
when available), and the engine's own repro script (`Engine.write_repro`),
which needs only numpy and that engine, prints the error and exits 1 while
the bug is present and 0 once it is fixed.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from bisect_tui.core import atomic


def write_bundle(dest: Path, culprits: list[dict], config: dict, tolerance: dict, report_md: str,
                 version: str, engine, workaround: dict | None = None,
                 reference_name: str = "unfused FP32 baseline") -> Path:
    """Zip each isolated culprit (see isolate.py for the files) with the
    engine's repro script: the first in `repro/`, further ones in `repro_2/`...
    `reference_name`: what computed expected.npz, in the scripts' words."""
    import tempfile

    from bisect_tui.api import ReproSpec

    buf = io.BytesIO()
    tol = {k: v for k, v in tolerance.items() if k in
           ("atol", "rtol", "max_abs", "mean_abs", "min_cosine", "max_fail_share")}
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z, \
            tempfile.TemporaryDirectory(prefix="bisect_tui_repro_") as tmp:
        for i, culprit in enumerate(culprits, 1):
            folder = "repro" if i == 1 else f"repro_{i}"
            iso = culprit["isolated"]
            sub_dir = Path(iso["subgraph"]).parent
            spec = ReproSpec(
                model_file="subgraph.onnx", inputs_file="inputs.npz", config=config,
                outputs=list(iso.get("subgraph_outputs") or []), tolerance=tol,
                reference={"file": "expected.npz", "name": reference_name},
                workaround=workaround,
                extra={"version": version, "op_type": culprit["op_type"], "fused_node": culprit["fused_node"] or "the whole model",
                       "optimizers": culprit["optimizers"], "original_nodes": culprit["original_nodes"],
                       "inputs": list(iso.get("subgraph_inputs") or [])},
            )
            out = Path(tmp) / folder
            out.mkdir()
            written = engine.write_repro(out, spec)
            for name in ("subgraph.onnx", "inputs.npz", "expected.npz", "truth_float64.npz"):
                p = sub_dir / name
                if p.exists():
                    z.write(p, f"{folder}/{name}")
            for p in written:
                z.write(p, f"{folder}/{p.name}")
        z.writestr("REPORT.md", report_md)
    atomic.write_bytes(Path(dest), buf.getvalue())
    return Path(dest)
