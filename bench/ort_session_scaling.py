"""Benchmark: what one ONNX Runtime session costs as the graph grows, and which
of its graph transformers grows faster than the graph.

Why it is here: a bisection's whole-graph builds are sessions of the user's
engine, and on the two-culprit stacks of bench/scale_models.py the ratio to
`polygraphy debug reduce` falls from 13x at 500 nodes to 6-8x at 21,000
(docs/benchmarks.md section 4). debug reduce builds halves, quarters, ... of
the graph; we build the whole graph six times. A cost that grows with the
square of the node count punishes only us. This measures it, in our own
words, from ORT's own verbose log (the time between its
"Applying graph transformer X" lines), so the finding can be checked and
reported upstream without our tool in the way.

    .venv/bin/python bench/ort_session_scaling.py [--blocks 66,340,700,1400] [--runs 2]

Per size: session creation at ORT_DISABLE_ALL and at ORT_ENABLE_ALL (CPU
seconds of this process, the median of --runs), and the slowest transformers
of one ORT_ENABLE_ALL session at VERBOSE. Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scale_models import two_culprit_stack  # noqa: E402

_STAMP = re.compile(r"^\d+-\d+-\d+ (\d+):(\d+):(\d+)\.(\d+)")
_APPLY = re.compile(r"Applying graph transformer (\S+) on step")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def session_cpu(ort, data: bytes, level) -> float:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    t = _cpu()
    ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return _cpu() - t


def transformer_seconds(ort, data: bytes, workdir: Path) -> dict[str, float]:
    """Seconds from each "Applying graph transformer X" line to the next line of
    ORT's verbose log, summed per transformer (its own work and the graph
    resolve after it)."""
    log = workdir / "ort.log"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 0
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
    stamps = []
    for line in log.read_text(errors="replace").splitlines():
        m = _STAMP.match(line)
        if m:
            h, mi, s, frac = m.groups()
            stamps.append((int(h) * 3600 + int(mi) * 60 + int(s) + int(frac) / 10 ** len(frac), line))
    out: dict[str, float] = {}
    for (t0, line), (t1, _) in zip(stamps, stamps[1:]):
        m = _APPLY.search(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + (t1 - t0)
    return out


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", default="66,340,700,1400", help="blocks of 15 nodes each, comma-separated")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    import onnxruntime as ort

    print(f"onnxruntime {ort.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print("| nodes | session at DISABLE_ALL, CPU s | at ENABLE_ALL, CPU s | slowest transformers at ENABLE_ALL (s) |")
    print("|---|---|---|---|")
    L = ort.GraphOptimizationLevel
    with tempfile.TemporaryDirectory(prefix="ort_scaling_") as d:
        for blocks in (int(b) for b in args.blocks.split(",") if b.strip()):
            model, _ = two_culprit_stack(blocks, blocks * 5 // 8)
            data = model.SerializeToString()
            off = median([session_cpu(ort, data, L.ORT_DISABLE_ALL) for _ in range(args.runs)])
            full = median([session_cpu(ort, data, L.ORT_ENABLE_ALL) for _ in range(args.runs)])
            per = transformer_seconds(ort, data, Path(d))
            top = sorted(per.items(), key=lambda kv: -kv[1])[:3]
            print(f"| {len(model.graph.node):,} | {off:.2f} | {full:.2f} | "
                  + ", ".join(f"{k} {v:.2f}" for k, v in top) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
