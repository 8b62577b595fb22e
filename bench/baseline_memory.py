"""Benchmark: peak memory of the FP32 baseline dump on a model whose activations
sum to several GB, against the naive "mark every tensor, run once" dump.

Issue acceptance: "Baseline of a model whose activations sum to several GB stays
under the memory budget (measured in a benchmark under bench/)".

    .venv/bin/python bench/baseline_memory.py [--ops 320] [--keep]

What it does (everything under one tempfile dir in /tmp, removed at the end):

1. Builds, with onnx.helper, a chain of cheap elementwise ops (Relu, Add, Mul
   with scalar initializers) on an input of [1, 64, 256, 256] float32 (16 MiB).
   Every activation is 16 MiB; with 320 ops they sum to 5 GiB.
2. Runs, each in a fresh subprocess so that the peak RSS belongs to one run:
   a) bisect-tui's baseline step with a 512 MiB budget (core API:
      Triage(...).prepare(); .run_baseline()),
   b) the same with a 2 GiB budget,
   c) the peer: every tensor marked as a graph output of one ORT_DISABLE_ALL
      session (default SessionOptions otherwise), run once, each output saved
      with np.save. That is what hand-written dump scripts and Polygraphy's
      `--onnx-outputs mark all` do.
   Each child reports ru_maxrss (the kernel's high-water mark, authoritative)
   and a psutil/proc sample every 5 ms (split into anonymous memory and
   file-backed pages, the latter being the memmap'd .npy pages), plus the RSS
   after imports and model loading ("floor").
3. Prints a table and the ratios. The dump of each run is deleted before the
   next run starts, so at most ~5 GiB is on disk at a time.

No timing or memory asserts: this prints figures, it does not pass or fail.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MB = 1 << 20
GB = 1 << 30
SHAPE = [1, 64, 256, 256]


# --------------------------------------------------------------------------- model
def build_model(path: Path, n_ops: int) -> int:
    """A chain of n_ops elementwise ops; returns the bytes of all activations."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.array(1.0009765625, dtype=np.float32), "scale"),
        numpy_helper.from_array(np.array(-0.0009765625, dtype=np.float32), "shift"),
    ]
    nodes = []
    prev = "x"
    for i in range(n_ops):
        out = f"t{i:04d}" if i < n_ops - 1 else "y"
        kind = i % 3
        if kind == 0:
            nodes.append(helper.make_node("Mul", [prev, "scale"], [out], name=f"mul_{i}"))
        elif kind == 1:
            nodes.append(helper.make_node("Add", [prev, "shift"], [out], name=f"add_{i}"))
        else:
            nodes.append(helper.make_node("Relu", [prev], [out], name=f"relu_{i}"))
        prev = out
    graph = helper.make_graph(
        nodes,
        "activation_heavy_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return n_ops * int(np.prod(SHAPE)) * 4


# --------------------------------------------------------------------------- child
class _Sampler:
    """Samples the process' RSS every few ms, split into anon and file-backed."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.peak = {"rss": 0, "anon": 0, "file": 0, "shmem": 0}
        self.at_peak = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def read() -> dict:
        vals = {}
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    for key, name in (("VmRSS:", "rss"), ("RssAnon:", "anon"),
                                      ("RssFile:", "file"), ("RssShmem:", "shmem")):
                        if line.startswith(key):
                            vals[name] = int(line.split()[1]) * 1024
        except OSError:
            import psutil

            vals["rss"] = psutil.Process().memory_info().rss
        return vals

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval)

    def sample(self) -> None:
        v = self.read()
        for k, x in v.items():
            self.peak[k] = max(self.peak.get(k, 0), x)
        if v.get("rss", 0) >= self.peak["rss"]:
            self.at_peak = v

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.sample()


def _dir_bytes(d: Path) -> tuple[int, int]:
    n = size = 0
    for root, _dirs, files in os.walk(d):
        for f in files:
            if f.endswith(".npy"):
                n += 1
                size += os.path.getsize(os.path.join(root, f))
    return n, size


def child(mode: str, model: Path, workdir: Path, budget: int) -> dict:
    import numpy as np  # noqa: F401  (imports count towards the floor)
    import onnx
    import onnxruntime as ort

    with _Sampler() as s:
        t0 = time.perf_counter()
        out: dict = {"mode": mode, "budget": budget}
        if mode == "budgeted":
            from bisect_tui.core.pipeline import Triage, TriageOptions

            t = Triage(TriageOptions(model=model, session_dir=workdir, max_memory=budget,
                                     check_determinism=False))
            t.prepare()
            out["floor_rss"] = _Sampler.read()["rss"]
            t0 = time.perf_counter()
            res = t.run_baseline()
            out["groups"] = res.manifest["options"]["groups"]
            out["tensors"] = len(res.manifest["tensors"])
            dump_dir = t.session.baseline_dir
        else:
            m = onnx.load(str(model))
            seen = {o.name for o in m.graph.output}
            for node in m.graph.node:
                for o in node.output:
                    if o and o not in seen:
                        m.graph.output.append(onnx.ValueInfoProto(name=o))
                        seen.add(o)
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.log_severity_level = 3
            sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
            x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
            out["floor_rss"] = _Sampler.read()["rss"]
            t0 = time.perf_counter()
            names = [o.name for o in sess.get_outputs()]
            values = sess.run(names, {"x": x})
            dump_dir = workdir / "naive"
            dump_dir.mkdir(parents=True, exist_ok=True)
            for i, (name, v) in enumerate(zip(names, values)):
                np.save(dump_dir / f"{i:04d}_{name}.npy", v)
            out["groups"] = 1
            out["tensors"] = len(names)
            del values
        out["seconds"] = time.perf_counter() - t0
    out["files"], out["bytes_written"] = _dir_bytes(dump_dir)
    out["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    out["sampled_peak"] = s.peak
    out["sampled_at_peak"] = s.at_peak
    out["ort"] = ort.__version__
    return out


# --------------------------------------------------------------------------- parent
def run_child(mode: str, model: Path, workdir: Path, budget: int) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "--child", mode, "--model", str(model),
           "--workdir", str(workdir), "--budget", str(budget)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"child {mode} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_wall"] = wall
    shutil.rmtree(workdir, ignore_errors=True)  # ~5 GB per run: free it before the next one
    return res


def mb(x: float) -> str:
    return f"{x / MB:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=320, help="chain length (16 MiB per op; default 320 = 5 GiB)")
    ap.add_argument("--budgets", default="512M,2G", help="bisect-tui budgets to run (default 512M,2G)")
    ap.add_argument("--no-naive", action="store_true", help="skip the naive peer run")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        print(json.dumps(child(args.child, Path(args.model), Path(args.workdir), args.budget)))
        return 0

    from bisect_tui.core.memory import parse_memory

    budgets = [parse_memory(b) for b in args.budgets.split(",") if b.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="bench_baseline_mem_", dir="/tmp"))
    try:
        model = tmp / "chain.onnx"
        act = build_model(model, args.ops)
        free = shutil.disk_usage(tmp).free
        if free < act * 1.3:
            print(f"need ~{act * 1.3 / GB:.1f} GB free in /tmp, have {free / GB:.1f} GB", file=sys.stderr)
            return 2
        print(f"model: {args.ops} elementwise ops on {SHAPE} float32 "
              f"({mb(act / args.ops)} MiB each), activations sum to {act / GB:.2f} GiB")
        rows = []
        for b in budgets:
            print(f"running bisect-tui baseline, budget {mb(b)} MiB ...", flush=True)
            rows.append(("bisect-tui", run_child("budgeted", model, tmp / f"s{b}", b)))
        if not args.no_naive:
            print("running naive mark-all dump ...", flush=True)
            rows.append(("naive mark-all", run_child("naive", model, tmp / "naive", 0)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(f"onnxruntime {rows[0][1]['ort']}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    hdr = (f"{'run':<15} {'budget MiB':>10} {'groups':>6} {'peak RSS MiB':>12} {'anon@pk':>8} "
           f"{'file@pk':>8} {'floor MiB':>9} {'peak-budget':>11} {'written GB':>10} {'files':>5} "
           f"{'dump s':>7} {'proc s':>7}")
    print(hdr)
    print("-" * len(hdr))
    for name, r in rows:
        at = r["sampled_at_peak"]
        over = f"{mb(r['ru_maxrss'] - r['budget'])}" if r["budget"] else "-"
        print(f"{name:<15} {mb(r['budget']) if r['budget'] else '-':>10} {r['groups']:>6} "
              f"{mb(r['ru_maxrss']):>12} {mb(at.get('anon', 0)):>8} {mb(at.get('file', 0) + at.get('shmem', 0)):>8} "
              f"{mb(r['floor_rss']):>9} {over:>11} {r['bytes_written'] / 1e9:>10.2f} {r['files']:>5} "
              f"{r['seconds']:>7.1f} {r['process_wall']:>7.1f}")
    print()
    print("peak RSS = ru_maxrss of the child; anon@pk/file@pk = anonymous and file-backed (memmap)")
    print("pages in the highest 5 ms sample; floor = RSS after imports + model load, before the dump.")
    naive = next((r for n, r in rows if n.startswith("naive")), None)
    for name, r in rows:
        if not r["budget"]:
            continue
        over = r["ru_maxrss"] - r["budget"]
        act_part = r["ru_maxrss"] - r["floor_rss"]
        line = (f"budget {mb(r['budget'])} MiB: peak {mb(r['ru_maxrss'])} MiB = floor {mb(r['floor_rss'])} "
                f"+ dump {mb(act_part)} MiB ({act_part / r['budget']:.2f}x the budget); "
                f"overhead over budget {mb(over)} MiB; "
                f"{'within' if r['ru_maxrss'] <= r['budget'] + 256 * MB else 'NOT within'} budget + 256 MiB")
        if naive:
            line += f"; naive/budgeted peak = {naive['ru_maxrss'] / r['ru_maxrss']:.1f}x"
            line += f", dump time budgeted/naive = {r['seconds'] / max(naive['seconds'], 1e-9):.2f}x"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
