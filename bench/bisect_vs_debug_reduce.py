"""Benchmark: `bisect-tui bisect` against Polygraphy's `debug reduce` on the same
failing model, in one run.

Issue acceptance: "A benchmark in bench/ runs the same failing model through
`bisect-tui bisect` and through Polygraphy's `debug reduce` (bisect mode, with
an equivalent check script) in one run and prints engine builds, wall time and
the size of the answer for both. Target: fewer builds and at least 3x less wall
time than `debug reduce`, with an answer no larger than the fused pattern
itself."

    .venv/bin/python bench/bisect_vs_debug_reduce.py [--repeat 3] [--models deep_stack,two_culprits]

Needs `sample_models/*.onnx` (`make samples`) and `onnx_graphsurgeon`, which
`polygraphy debug reduce` imports (`pip install onnx-graphsurgeon`).

The fused engine in both tools: ONNX Runtime CPU, ORT_ENABLE_ALL with session
config `optimization.enable_gelu_approximation=1`; the reference: the same
model at ORT_DISABLE_ALL. The same input (seed 0 standard normal, scaled as in
cases.json) goes to both tools.

bisect-tui: `bisect-tui bisect MODEL --session TMP --input x.npz --ort-config
optimization.enable_gelu_approximation=1 --json OUT -q`, run as a subprocess.
Engine builds = `bisect.engine_builds` from OUT (fused-engine builds of the
search, attribution and workaround; the `check` step's fused build before the
search is listed separately). Answer = original nodes of all culprits.

Polygraphy: its documented workflow for failures that need real intermediate
values (examples/cli/debug/02_reducing_failing_onnx_models): first dump every
tensor of the unfused model once ("golden", the equivalent of bisect-tui's
baseline, timed as part of Polygraphy's total), then

    polygraphy debug reduce MODEL -o reduced.onnx --mode=bisect \
        --load-inputs inputs.json \
        --check PYTHON check.py polygraphy_debug.onnx golden.npz counter.txt

`--load-inputs` makes the fallback inference that reduce uses to freeze cut
branches see the same input. check.py (written into the temp dir) feeds each
candidate's graph inputs from the golden dump, builds it at ORT_DISABLE_ALL and
at ORT_ENABLE_ALL + gelu approximation, and exits 1 when an output breaks
|a - b| <= 1e-4 + 1e-4 |b| or cosine >= 0.99999 (bisect-tui's fp32 preset). It
is deliberately lean (ORT and numpy only): a `polygraphy run` check would cost
more per iteration and flatter bisect-tui. Engine builds = 2 x check runs (each
run builds a fused and an unfused session); fused builds = check runs. Answer =
nodes in reduced.onnx.

Both tools also run under a small wrapper that counts every
onnxruntime.InferenceSession the process creates (by optimization level), so
the table shows all ORT sessions, not only what each tool calls a build.

Wall times are the median of --repeat runs (each a fresh session directory).
Prints ratios; no asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
GELU_CFG = {"optimization.enable_gelu_approximation": "1"}

# Counts InferenceSession constructions of the wrapped program by level and
# writes them to $BENCH_SESSION_COUNT at exit. Then runs the program.
COUNTER = r'''
import atexit, json, os, runpy, sys
import onnxruntime as ort
_counts = {}
_orig = ort.InferenceSession.__init__
def _init(self, path_or_bytes, sess_options=None, *a, **k):
    lvl = "default(all)"
    if sess_options is not None:
        lvl = str(sess_options.graph_optimization_level).split(".")[-1]
    _counts[lvl] = _counts.get(lvl, 0) + 1
    return _orig(self, path_or_bytes, sess_options, *a, **k)
ort.InferenceSession.__init__ = _init
def _dump():
    with open(os.environ["BENCH_SESSION_COUNT"], "w") as fh:
        json.dump(_counts, fh)
atexit.register(_dump)
kind, target = sys.argv[1], sys.argv[2]
sys.argv = [target] + sys.argv[3:]
if kind == "module":
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    runpy.run_path(target, run_name="__main__")
'''

# Golden dump for Polygraphy: every tensor of the unfused model, one run.
PREP = r'''
import json, sys
import numpy as np, onnx, onnxruntime as ort
model, inputs_npz, golden, inputs_json = sys.argv[1:5]
m = onnx.load(model)
feeds = dict(np.load(inputs_npz))
seen = {o.name for o in m.graph.output}
for n in m.graph.node:
    for o in n.output:
        if o and o not in seen:
            m.graph.output.append(onnx.ValueInfoProto(name=o)); seen.add(o)
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
so.log_severity_level = 3
s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
names = [o.name for o in s.get_outputs()]
values = dict(zip(names, s.run(names, feeds)))
values.update(feeds)
index = {k: f"t{i}" for i, k in enumerate(values)}
np.savez(golden, __index__=np.array(json.dumps(index)), **{index[k]: v for k, v in values.items()})
from polygraphy.json import save_json
save_json([feeds], inputs_json)
'''

CHECK = r'''
import json, sys
import numpy as np, onnx, onnxruntime as ort
model_path, golden_path, counter = sys.argv[1:4]
with open(counter, "a") as fh:
    fh.write("run\n")
m = onnx.load(model_path)
inits = {i.name for i in m.graph.initializer}
g = np.load(golden_path)
index = json.loads(str(g["__index__"]))
feeds = {i.name: g[index[i.name]] for i in m.graph.input if i.name not in inits}
data = m.SerializeToString()
def session(level, cfg):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    for k, v in cfg.items():
        so.add_session_config_entry(k, v)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
names = [o.name for o in m.graph.output]
ref = session(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, {}).run(names, feeds)
test = session(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, CFG).run(names, feeds)
bad = []
for name, a, b in zip(names, test, ref):
    a = np.asarray(a, np.float64).ravel(); b = np.asarray(b, np.float64).ravel()
    ok = bool(np.all(np.abs(a - b) <= ATOL + RTOL * np.abs(b)))
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    cos = float(a @ b) / den if den > 0 else (1.0 if np.array_equal(a, b) else 0.0)
    if not ok or cos < MIN_COS:
        bad.append(name)
print(("FAIL " if bad else "PASS ") + f"{len(m.graph.node)} nodes {bad}")
sys.exit(1 if bad else 0)
'''


def load_cases() -> dict:
    data = json.loads((SAMPLES / "cases.json").read_text())
    return {c["model"]: c for c in data["cases"]}


def write_inputs(model: Path, case: dict, path: Path) -> None:
    import numpy as np
    import onnx

    m = onnx.load(str(model))
    inits = {i.name for i in m.graph.initializer}
    rng = np.random.default_rng(0)
    arrays = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        shape = case["input"][vi.name]
        arrays[vi.name] = (rng.standard_normal(shape) * case.get("input_scale", 1.0)).astype(np.float32)
    np.savez(path, **arrays)


def polygraphy_site() -> str | None:
    """Where polygraphy and onnx-graphsurgeon live when they are not in this venv: a folder made
    with `pip install --no-deps --target DIR polygraphy onnx-graphsurgeon`, named by
    $BENCH_POLYGRAPHY_PATH (default /tmp/polyg). Only the peer's subprocesses see it on
    PYTHONPATH, so bisect-tui's own runs import nothing extra."""
    d = os.environ.get("BENCH_POLYGRAPHY_PATH", "/tmp/polyg")
    return d if (Path(d) / "polygraphy").is_dir() else None


def polygraphy_env(env: dict | None = None) -> dict:
    env = dict(os.environ if env is None else env)
    site = polygraphy_site()
    if site:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
    return env


def polygraphy_cmd() -> list[str]:
    """The `polygraphy` command: the venv's console script, else the --target folder's."""
    script = Path(sys.executable).parent / "polygraphy"
    site = polygraphy_site()
    if not script.exists() and site:
        script = Path(site) / "bin" / "polygraphy"
    return [sys.executable, str(script)]


def peer_versions() -> tuple[str, str] | None:
    """polygraphy's and onnx-graphsurgeon's versions as the peer's subprocesses import them,
    or None when either is missing."""
    r = subprocess.run([sys.executable, "-c", "import polygraphy, onnx_graphsurgeon as g; "
                        "print(polygraphy.__version__, g.__version__)"],
                       capture_output=True, text=True, env=polygraphy_env())
    return tuple(r.stdout.split()) if r.returncode == 0 else None


INSTALL_HINT = (f"debug reduce needs polygraphy and onnx-graphsurgeon: {sys.executable} -m pip install "
                "--no-deps --target /tmp/polyg polygraphy onnx-graphsurgeon (or set BENCH_POLYGRAPHY_PATH)")


def counted(cmd_kind: str, target: str, args: list[str], tmp: Path, cwd: Path) -> tuple[subprocess.CompletedProcess, float, dict]:
    count_file = tmp / f"sessions_{time.monotonic_ns()}.json"
    # TMPDIR inside our temp dir: polygraphy's shape inference leaves a
    # tmp_polygraphy_*.onnx in the temp dir on every run and never deletes it.
    env = {**polygraphy_env(), "BENCH_SESSION_COUNT": str(count_file), "TMPDIR": str(tmp)}
    cmd = [sys.executable, str(tmp / "count_sessions.py"), cmd_kind, target, *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    counts = json.loads(count_file.read_text()) if count_file.exists() else {}
    count_file.unlink(missing_ok=True)
    return proc, wall, counts


def run_bisect_tui(model: Path, inputs: Path, tmp: Path, k: int) -> dict:
    sess = tmp / f"bt_session_{k}"
    out = tmp / f"bt_{k}.json"
    args = ["bisect", str(model), "--session", str(sess), "--input", str(inputs),
            "--ort-config", "optimization.enable_gelu_approximation=1", "--json", str(out), "-q"]
    proc, wall, counts = counted("module", "bisect_tui", args, tmp, tmp)
    if proc.returncode not in (0, 1) or not out.exists():
        raise SystemExit(f"bisect-tui failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    full = json.loads(out.read_text())
    b = full["bisect"]
    culprits = [c["original_nodes"] for c in b.get("culprits", [])]
    res = {
        "wall": wall,
        "builds": b["engine_builds"],
        "check_build": 1,  # run_fused() before the search builds the full engine once
        "sessions": counts,
        "culprits": culprits,
        "answer_nodes": sum(len(c) for c in culprits),
        "verdict": b.get("verdict"),
        "steps": len(b.get("steps", [])),
        "search_s": b.get("seconds"),
    }
    shutil.rmtree(sess, ignore_errors=True)
    out.unlink(missing_ok=True)
    return res


def run_polygraphy(model: Path, inputs: Path, tmp: Path, k: int) -> dict:
    import onnx

    work = tmp / f"pg_{k}"
    work.mkdir()
    counter = work / "counter.txt"
    polygraphy = polygraphy_cmd()[1]
    t0 = time.perf_counter()
    prep = subprocess.run([sys.executable, str(tmp / "prep.py"), str(model), str(inputs),
                           str(work / "golden.npz"), str(work / "inputs.json")],
                          capture_output=True, text=True, env=polygraphy_env())
    prep_s = time.perf_counter() - t0
    if prep.returncode != 0:
        raise SystemExit(f"golden dump failed:\n{prep.stderr[-2000:]}")
    args = ["debug", "reduce", str(model), "-o", "reduced.onnx", "--mode=bisect",
            "--load-inputs", "inputs.json",
            "--check", sys.executable, str(tmp / "check.py"), "polygraphy_debug.onnx",
            "golden.npz", str(counter)]
    proc, reduce_s, counts = counted("path", polygraphy, args, tmp, work)
    if proc.returncode != 0 or not (work / "reduced.onnx").exists():
        raise SystemExit(f"polygraphy debug reduce failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    runs = len(counter.read_text().splitlines()) if counter.exists() else 0
    reduced = onnx.load(str(work / "reduced.onnx"))
    nodes = [n.name for n in reduced.graph.node]
    res = {
        "wall": prep_s + reduce_s,
        "prep": prep_s,
        "reduce": reduce_s,
        "check_runs": runs,
        "builds": 2 * runs,
        "fused_builds": runs,
        "sessions": {"reduce process": counts, "check scripts": 2 * runs, "golden dump": 1},
        "culprits": [nodes],
        "answer_nodes": len(nodes),
        "inputs": [i.name for i in reduced.graph.input if i.name not in {t.name for t in reduced.graph.initializer}],
        "outputs": [o.name for o in reduced.graph.output],
    }
    shutil.rmtree(work, ignore_errors=True)
    return res


def judge_answer(found: list[list[str]], expected: list[list[str]]) -> str:
    exp_sets = [set(e) for e in expected]
    hit = sum(1 for e in exp_sets if any(e <= set(f) for f in found))
    extra = sum(len(set(f) - set().union(*exp_sets)) for f in found)
    return f"{hit}/{len(exp_sets)} culprits covered, {extra} node(s) outside them"


def total_sessions(c: dict) -> int:
    n = 0
    for v in c.values():
        n += total_sessions(v) if isinstance(v, dict) else int(v)
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="deep_stack,two_culprits")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool and model (median wall time)")
    args = ap.parse_args()

    versions = peer_versions()
    if versions is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    import onnx
    import onnxruntime as ort

    from bisect_tui import __version__ as bt_version

    cases = load_cases()
    print(f"onnxruntime {ort.__version__}, polygraphy {versions[0]}, onnx-graphsurgeon {versions[1]}, onnx {onnx.__version__}, "
          f"bisect-tui {bt_version}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print("fused engine: ORT CPU, ORT_ENABLE_ALL + optimization.enable_gelu_approximation=1; "
          "reference: ORT_DISABLE_ALL; tolerance: atol=rtol=1e-4, cosine>=0.99999")
    print(f"polygraphy command: polygraphy debug reduce MODEL -o reduced.onnx --mode=bisect "
          f"--load-inputs inputs.json --check {Path(sys.executable).name} check.py polygraphy_debug.onnx "
          f"golden.npz counter.txt")
    print()

    tmp = Path(tempfile.mkdtemp(prefix="bench_bisect_reduce_", dir="/tmp"))
    rows = []
    try:
        (tmp / "count_sessions.py").write_text(COUNTER)
        (tmp / "prep.py").write_text(PREP)
        (tmp / "check.py").write_text(
            f"CFG = {GELU_CFG!r}\nATOL = 1e-4\nRTOL = 1e-4\nMIN_COS = 0.99999\n" + CHECK)
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            fname = name if name.endswith(".onnx") else name + ".onnx"
            model = SAMPLES / fname
            if not model.exists():
                print(f"{model} missing: run `make samples` first", file=sys.stderr)
                return 2
            case = cases[fname]
            inputs = tmp / f"{name}_inputs.npz"
            write_inputs(model, case, inputs)
            bt, pg = [], []
            for k in range(args.repeat):
                print(f"{name}: run {k + 1}/{args.repeat} bisect-tui ...", end=" ", flush=True)
                bt.append(run_bisect_tui(model, inputs, tmp, k))
                print("polygraphy debug reduce ...", flush=True)
                pg.append(run_polygraphy(model, inputs, tmp, k))
            rows.append((name, case, len(onnx.load(str(model)).graph.node), bt, pg))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    targets_all = True
    for name, case, n_nodes, bt, pg in rows:
        expected = case.get("expected_culprits") or []
        pattern = max((len(e) for e in expected), default=0)
        b, p = bt[-1], pg[-1]
        b_wall = statistics.median(r["wall"] for r in bt)
        p_wall = statistics.median(r["wall"] for r in pg)
        p_prep = statistics.median(r["prep"] for r in pg)
        p_red = statistics.median(r["reduce"] for r in pg)
        bvar = sorted({r["builds"] for r in bt})
        pvar = sorted({r["check_runs"] for r in pg})
        print(f"== {name}.onnx ({n_nodes} nodes; expected culprit(s): "
              f"{len(expected)} x {pattern}-node erf-Gelu pattern) ==")
        hdr = f"{'tool':<26} {'engine builds':>13} {'fused builds':>12} {'ORT sessions':>12} {'wall s':>7} {'answer nodes':>12}  answer"
        print(hdr)
        print("-" * len(hdr))
        bt_sessions = total_sessions(b["sessions"])
        print(f"{'bisect-tui bisect':<26} {b['builds']:>13} {b['builds'] + b['check_build']:>12} {bt_sessions:>12} "
              f"{b_wall:>7.2f} {b['answer_nodes']:>12}  {judge_answer(b['culprits'], expected)}")
        pg_sessions = total_sessions(p["sessions"])
        print(f"{'polygraphy debug reduce':<26} {p['builds']:>13} {p['fused_builds']:>12} {pg_sessions:>12} "
              f"{p_wall:>7.2f} {p['answer_nodes']:>12}  {judge_answer(p['culprits'], expected)}")
        b_search = statistics.median(r["search_s"] or 0.0 for r in bt)
        print(f"  bisect-tui: verdict {b['verdict']}, {b['steps']} search steps, search itself "
              f"(bisect.seconds) {b_search:.2f} s of {b_wall:.2f} s wall; culprits "
              + "; ".join(", ".join(c) for c in b["culprits"]))
        print(f"  bisect-tui ORT sessions by level: {b['sessions']}"
              + (f"; engine builds varied across runs: {bvar}" if len(bvar) > 1 else ""))
        print(f"  polygraphy: {p['check_runs']} check runs (x2 sessions each); wall = golden dump {p_prep:.2f} s "
              f"+ reduce {p_red:.2f} s; reduced.onnx inputs {p['inputs']} outputs {p['outputs']}")
        print(f"  polygraphy reduced.onnx nodes: {', '.join(p['culprits'][0])}"
              + (f"; check runs varied across runs: {pvar}" if len(pvar) > 1 else ""))
        print(f"  polygraphy ORT sessions: {p['sessions']}")
        builds_ratio = p["builds"] / max(b["builds"], 1)
        wall_ratio = p_wall / b_wall
        print(f"  ratios (polygraphy / bisect-tui): engine builds {builds_ratio:.2f}x "
              f"(fused builds only {p['fused_builds'] / (b['builds'] + b['check_build']):.2f}x, "
              f"all ORT sessions {pg_sessions / max(bt_sessions, 1):.2f}x), wall time {wall_ratio:.2f}x "
              f"(reduce step alone {p_red / b_wall:.2f}x)")
        per_culprit = max((len(c) for c in b["culprits"]), default=0)
        t_builds = b["builds"] < p["builds"]
        t_wall = wall_ratio >= 3.0
        t_answer = bool(b["culprits"]) and per_culprit <= pattern
        ok = t_builds and t_wall and t_answer
        targets_all &= ok
        print(f"  targets: fewer builds {'MET' if t_builds else 'NOT MET'} ({b['builds']} vs {p['builds']}); "
              f">=3x less wall time {'MET' if t_wall else 'NOT MET'} ({wall_ratio:.2f}x); "
              f"answer <= fused pattern {'MET' if t_answer else 'NOT MET'} "
              f"({per_culprit} vs {pattern} nodes per culprit)")
        print()
    print("all targets met" if targets_all else "NOT all targets met (see above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
