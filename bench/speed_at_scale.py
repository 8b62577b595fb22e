"""Benchmark: speed at scale, bisect-tui (1 worker and N workers) against
Polygraphy's `debug reduce` (bisect, and linear where it finishes in reasonable
time) on models of about 100, 1,000 and 5,000+ nodes with one known culprit, and on
stacks of about 500, 1,000 and 5,000 nodes (21,000 with --huge) with two culprits one
behind the other (LayerNorm keepdims=0: LayerNormFusionL1, then SimplifiedLayerNormFusion;
bench/scale_models.py), plus the baseline dump's throughput against plain
numpy.save to the same disk. One run; ratios are within it. Prints, asserts
nothing.

    .venv/bin/python bench/speed_at_scale.py [--models transformer_100,...] [--workers 2]
        [--linear-max-nodes 150] [--linear-timeout 300] [--huge] [--rows w1,wN,np1,npN]

Rows per model:
- bisect-tui w1 k1: `bisect-tui bisect --workers 1 --fanout 1` (the binary search, one build at a time);
- bisect-tui wN kN: `--workers N --fanout N` (N split points a round, N builds at a time);
- bisect-tui --no-probe w1 kN and wN kN: the search by builds alone (the probe usually names the
  culprit at once, leaving no rounds to run in parallel), with the same builds one at a time and N at
  a time: the speed-up of the pool;
- debug reduce bisect / linear: as in bench/bisect_vs_debug_reduce.py (golden dump of the unfused
  model timed with it, a lean ORT+numpy check script, `--load-inputs`).

Columns: wall time of the whole command (bisect-tui includes its baseline, determinism run and
check), whole-graph engine builds, subgraph builds, peak memory (sum of the RSS of the tool's
process tree, sampled every 50 ms), right answer (the expected culprit's nodes covered, nodes
outside it), answer size, and the bound ceil(log2(fused nodes)) + 3 for the search's builds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bisect_vs_debug_reduce as peer  # noqa: E402
from scale_models import HUGE, MODELS, build, ort_config  # noqa: E402

# the peer's check script, counting the nodes of each candidate it is asked to judge
CHECK = peer.CHECK.replace(
    'with open(counter, "a") as fh:\n    fh.write("run\\n")\nm = onnx.load(model_path)\n',
    'm = onnx.load(model_path)\nwith open(counter, "a") as fh:\n    fh.write(f"{len(m.graph.node)}\\n")\n')
assert CHECK != peer.CHECK


class TreePeak:
    """Peak of the summed RSS of a process and its descendants."""

    def __init__(self, pid: int):
        import psutil

        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.proc] + self.proc.children(recursive=True)
                total = 0
                for p in procs:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
            except psutil.Error:
                pass
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def timed(cmd: list[str], cwd: Path, timeout: float | None = None, env=None):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = TreePeak(p.pid)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return None, time.perf_counter() - t0, peak.stop(), out, err
    return p.returncode, time.perf_counter() - t0, peak.stop(), out, err


def judge(found: list[list[str]], expected: list[list[str]]) -> tuple[bool, str]:
    exp = [set(e) for e in expected]
    hit = sum(1 for e in exp if any(e <= set(f) for f in found))
    extra = sum(len(set(f) - set().union(*exp)) for f in found)
    ok = hit == len(exp) and extra == 0
    return ok, f"{hit}/{len(exp)} covered, {extra} outside"


def run_bt(model: Path, inputs: Path, tmp: Path, workers: int, fanout: int, tag: str, probe: bool = True,
           setting: str | None = "optimization.enable_gelu_approximation=1") -> dict:
    out = tmp / f"{tag}.json"
    sess = tmp / f"{tag}_session"
    cmd = [str(Path(sys.executable).parent / "bisect-tui"), "bisect", str(model), "--session", str(sess),
           "--input", str(inputs), *(["--ort-config", setting] if setting else []),
           "--workers", str(workers), "--fanout", str(fanout), "--json", str(out), "-q"]
    if not probe:
        cmd.append("--no-probe")
    rc, wall, peak, so, se = timed(cmd, tmp)
    if rc not in (0, 1) or not out.exists():
        raise SystemExit(f"bisect-tui failed ({rc}):\n{so[-2000:]}\n{se[-2000:]}")
    b = json.loads(out.read_text())["bisect"]
    culprits = [c["original_nodes"] for c in b.get("culprits", [])]
    sub = b.get("subgraph_builds", 0) or 0  # suspects confirmed on their own subgraph
    for c in b.get("culprits", []):
        sub += ((c.get("attribution") or {}).get("group_test") or {}).get("builds", 0) or 0
        sub += 1 if (c.get("isolated") or {}).get("subgraph") else 0  # the culprit's region through the engine
        sub += (c.get("attribution") or {}).get("subgraph_builds", 0) or 0  # its tagged passes on its subgraph
    fused = len(b.get("units", []))
    passes = sorted({n for c in b.get("culprits", []) for n in (c.get("attribution") or {}).get("confirmed", [])})
    search_builds = sum(1 for s in b["steps"] if not s["cached"] and not s.get("subgraph")
                        and not s["kind"].startswith(("disable", "fixpoint", "workaround")))
    # the rounds the builds came in: at N workers a round of k builds takes ceil(k / N) build times,
    # so builds / sum(ceil(k / N)) is the most N workers can gain on this search (lone steps stay lone)
    built = [s for s in b["steps"] if not s["cached"]]
    sizes, i = [], 0
    while i < len(built):
        k = built[i].get("round_size") or 1
        sizes.append(k)
        i += k
    res = {"wall": wall, "whole": b["engine_builds"] + 1, "round_sizes": sizes, "sub": sub, "peak": peak,
           "exposed_by": [c.get("exposed_by") for c in b.get("culprits", [])],
           "workaround": (b.get("workaround") or {}).get("disabled_optimizers"),
           "culprits": culprits,
           "answer": sum(len(c) for c in culprits), "fused": fused, "passes": passes,
           "search_builds": search_builds, "search_s": b.get("seconds"),
           "steps": [(s["kind"], s["region"], s["passed"]) for s in b["steps"]],
           "workers_used": sorted({s.get("worker", "main") for s in b["steps"] if not s["cached"]})}
    # what the session holds on disk (model copy, baseline, engines' optimized graphs, maps, steps):
    # the data the peak memory is set beside
    res["session_bytes"] = sum(f.stat().st_size for f in sess.rglob("*") if f.is_file())
    shutil.rmtree(sess, ignore_errors=True)
    return res


def run_pg(model: Path, inputs: Path, tmp: Path, mode: str, n_nodes: int, timeout: float | None,
           check: str = "check.py") -> dict:
    import onnx

    work = tmp / f"pg_{mode}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    counter = work / "counter.txt"
    t0 = time.perf_counter()
    prep = subprocess.run([sys.executable, str(tmp / "prep.py"), str(model), str(inputs),
                           str(work / "golden.npz"), str(work / "inputs.json")], capture_output=True, text=True,
                          env=peer.polygraphy_env())
    prep_s = time.perf_counter() - t0
    if prep.returncode != 0:
        raise SystemExit(f"golden dump failed:\n{prep.stderr[-2000:]}")
    cmd = [*peer.polygraphy_cmd(), "debug", "reduce", str(model), "-o", "reduced.onnx",
           f"--mode={mode}", "--load-inputs", "inputs.json",
           "--check", sys.executable, str(tmp / check), "polygraphy_debug.onnx", "golden.npz", str(counter)]
    rc, wall, peak, so, se = timed(cmd, work, timeout, env={**peer.polygraphy_env(), "TMPDIR": str(work)})
    sizes = [int(x) for x in counter.read_text().split()] if counter.exists() else []
    res = {"wall": prep_s + wall, "whole": 2 * sum(1 for s in sizes if s >= n_nodes),
           "sub": 2 * sum(1 for s in sizes if s < n_nodes), "peak": peak, "timed_out": rc is None,
           "runs": len(sizes)}
    if rc is None:
        res.update(culprits=[], answer=None)
    elif rc != 0 or not (work / "reduced.onnx").exists():
        raise SystemExit(f"debug reduce failed ({rc}):\n{so[-2000:]}\n{se[-2000:]}")
    else:
        nodes = [n.name for n in onnx.load(str(work / "reduced.onnx")).graph.node]
        res.update(culprits=[nodes], answer=len(nodes))
    shutil.rmtree(work, ignore_errors=True)
    return res


def dump_throughput(tmp: Path) -> dict:
    """bisect-tui's baseline dump (every tensor, with its statistics and digests) against
    numpy.save of the same arrays into the same folder."""
    from baseline_memory import build_model

    from bisect_tui.core.pipeline import Triage, TriageOptions
    from bisect_tui.engine_choice import engine_factory

    model = tmp / "chain.onnx"
    build_model(model, 48)  # 48 elementwise ops on [1, 64, 256, 256]: 16 MiB each, 768 MiB in all
    t = Triage(TriageOptions(model=model, session_dir=tmp / "dump_session", check_determinism=False),
               engine_factory=engine_factory("ort"))
    t.prepare()
    os.sync()  # start both timings with nothing left to flush
    t0 = time.perf_counter()
    t.run_baseline()
    bt_s = time.perf_counter() - t0
    files = sorted(t.session.baseline_dir.rglob("*.npy"))
    total = sum(f.stat().st_size for f in files)
    arrays = [np.load(f, allow_pickle=False, mmap_mode="r") for f in files]
    arrays = [np.array(a) for a in arrays]  # in memory: numpy.save only writes
    out = tmp / "npsave"
    out.mkdir()
    os.sync()
    t0 = time.perf_counter()
    for i, a in enumerate(arrays):
        with open(out / f"{i}.npy", "wb") as fh:
            np.save(fh, a, allow_pickle=False)
    os.sync()  # the same durability as the dump, which flushes its files before writing the manifest
    np_s = time.perf_counter() - t0
    del arrays
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(tmp / "dump_session", ignore_errors=True)
    return {"bytes": total, "files": len(files), "bt_s": bt_s, "np_s": np_s}


SPIN = "import time\nt = time.perf_counter()\nfor i in range(6_000_000): pass\nprint(time.perf_counter() - t)\n"


def model_and_inputs(name: str, tmp: Path) -> tuple[Path, dict, Path]:
    """The scale model `name` saved in `tmp`, its build info and its seeded inputs (.npz)."""
    model = tmp / f"{name}.onnx"
    info = build(name, model)
    inputs = tmp / f"{name}_x.npz"
    rng = np.random.default_rng(0)
    np.savez(inputs, **{k: rng.standard_normal(v).astype(np.float32) for k, v in info["input"].items()})
    return model, info, inputs


def cores_free() -> float:
    """How many cores two CPU-bound processes get right now (2.0 on an idle two-core
    machine, about 1.0 when others keep one busy): what N workers can gain at most."""
    def spin(k: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True) for _ in range(k)]
        return max(float(p.communicate()[0]) for p in procs)

    alone = spin(1)
    return round(2 * alone / spin(2), 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--huge", action="store_true",
                    help=f"also the {', '.join(HUGE)} model (about 21,000 nodes; minutes per row)")
    ap.add_argument("--rows", default="",
                    help="bisect-tui rows to run, comma-separated among w1,wN,np1,npN (default: all four)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--linear-max-nodes", type=int, default=150)
    ap.add_argument("--linear-timeout", type=float, default=300.0)
    ap.add_argument("--no-dump", action="store_true")
    ap.add_argument("--no-peer", action="store_true",
                    help="bisect-tui rows only (no debug reduce): for measuring the workers")
    ap.add_argument("--peer-repeat", type=int, default=1,
                    help="run debug reduce in this many of the repeats (after bisect-tui's rows; median)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each bisect-tui row this many times and keep the median wall time")
    args = ap.parse_args()
    # both tools as pip installs them, with bytecode: an editable install under
    # PYTHONDONTWRITEBYTECODE would compile bisect_tui's modules in every command
    # (0.1 s), while polygraphy's were compiled at install
    import compileall

    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "bisect_tui"), quiet=1)
    versions = None if args.no_peer else peer.peer_versions()
    if versions is None and not args.no_peer:
        print(peer.INSTALL_HINT, file=sys.stderr)
        return 2
    import onnxruntime as ort

    n = args.workers
    print(f"onnxruntime {ort.__version__}, polygraphy {versions[0] if versions else '-'}, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    tmp = Path(tempfile.mkdtemp(prefix="bench_scale_", dir="/tmp"))
    rows = []
    try:
        (tmp / "prep.py").write_text(peer.PREP)
        (tmp / "check.py").write_text(
            f"CFG = {peer.GELU_CFG!r}\nATOL = 1e-4\nRTOL = 1e-4\nMIN_COS = 0.99999\n" + CHECK)
        # the two-culprit stacks break at the default engine: the check builds it with no entry
        (tmp / "check_default.py").write_text("CFG = {}\nATOL = 1e-4\nRTOL = 1e-4\nMIN_COS = 0.99999\n" + CHECK)
        names = [m.strip() for m in args.models.split(",") if m.strip()] + (list(HUGE) if args.huge else [])
        wanted = {"w1": "bt_w1_k1", "wN": f"bt_w{n}_k{n}", "np1": f"np_w1_k{n}", "npN": f"np_w{n}_k{n}"}
        keep = {wanted[k.strip()] for k in args.rows.split(",") if k.strip()} or set(wanted.values())
        for name in names:
            model, info, inputs = model_and_inputs(name, tmp)
            free = cores_free()
            print(f"{name} ({info['nodes']} nodes), cores free for 2 processes {free}:", end=" ", flush=True)
            r = {}
            runs: dict[str, list] = {}
            # the rows take turns (1 worker, N workers, ...) in each repeat, so a change in the
            # shared machine's load falls on all of them alike; each row keeps its median run
            check = "check.py" if ort_config(name) else "check_default.py"
            for i in range(max(1, args.repeat)):
                for tag, w, k, pr in (("bt_w1_k1", 1, 1, True), (f"bt_w{n}_k{n}", n, n, True),
                                      (f"np_w1_k{n}", 1, n, False), (f"np_w{n}_k{n}", n, n, False)):
                    if tag not in keep:
                        continue
                    print(tag, end=" ", flush=True)
                    runs.setdefault(tag, []).append(run_bt(model, inputs, tmp, w, k, tag, pr, ort_config(name)))
                if not args.no_peer and i < args.peer_repeat:
                    # the peer takes its turn in the same repeat: both tools meet the same load
                    print("reduce-bisect", end=" ", flush=True)
                    runs.setdefault("pg_bisect", []).append(
                        run_pg(model, inputs, tmp, "bisect", info["nodes"], None, check))
            for tag, xs in runs.items():
                if tag == "pg_bisect":
                    xs.sort(key=lambda x: x["wall"])
                    r[tag] = xs[len(xs) // 2]
                    r[tag]["walls"] = [x["wall"] for x in xs]
                    continue
                xs.sort(key=lambda x: x["wall"])
                r[tag] = xs[len(xs) // 2]  # the median run (all its figures)
                r[tag]["walls"] = [x["wall"] for x in xs]
                r[tag]["search_all"] = sorted(x["search_s"] for x in xs)
                r[tag]["search_s"] = r[tag]["search_all"][len(xs) // 2]  # the median search time
            if args.no_peer:
                print(flush=True)
                r["cores_free"] = (free, cores_free())
                rows.append((name, info, r))
                continue
            if info["nodes"] <= args.linear_max_nodes:
                print("reduce-linear", end=" ", flush=True)
                r["pg_linear"] = run_pg(model, inputs, tmp, "linear", info["nodes"], args.linear_timeout, check)
            print(flush=True)
            r["cores_free"] = (free, cores_free())
            rows.append((name, info, r))
        dump = None if args.no_dump else dump_throughput(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print("| model | nodes | tool | wall s | whole-graph builds | subgraph builds | peak MiB | session MiB | "
          "right answer | answer nodes | log2 bound (search builds) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    for name, info, r in rows:
        exp = info["expected"]
        for tag, label in (("bt_w1_k1", "bisect-tui, 1 worker, fanout 1"),
                           (f"bt_w{n}_k{n}", f"bisect-tui, {n} workers, fanout {n}"),
                           (f"np_w1_k{n}", f"bisect-tui --no-probe, 1 worker, fanout {n}"),
                           (f"np_w{n}_k{n}", f"bisect-tui --no-probe, {n} workers, fanout {n}"),
                           ("pg_bisect", "debug reduce --mode bisect"), ("pg_linear", "debug reduce --mode linear")):
            x = r.get(tag)
            if x is None:
                continue
            ok, how = judge(x["culprits"], exp) if x.get("culprits") else (False, "timed out" if x.get("timed_out") else "none")
            bound = ""
            if tag.startswith(("bt", "np")):
                b = math.ceil(math.log2(max(x["fused"], 2))) + 3
                bound = f"{b} ({x['search_builds']})"
            sess_mib = f"{x['session_bytes'] / 2**20:.0f}" if "session_bytes" in x else ""
            print(f"| {name} | {info['nodes']} | {label} | {x['wall']:.2f} | {x['whole']} | {x['sub']} | "
                  f"{x['peak'] / 2**20:.0f} | {sess_mib} | {'yes' if ok else 'NO'} ({how}) | {x.get('answer')} | {bound} |")
        pg = r.get("pg_bisect")
        b1 = r.get("bt_w1_k1")
        if b1 is not None:
            summary.append(
                f"{name}: bisect-tui 1 worker {b1['wall']:.2f} s"
                + (f", debug reduce bisect {pg['wall']:.2f} s: {pg['wall'] / b1['wall']:.1f}x" if pg else "")
                + f"; whole-graph builds {b1['whole']} (search's own {b1['search_builds']}, bound "
                f"{math.ceil(math.log2(max(b1['fused'], 2))) + 3} per culprit); passes {b1['passes']}; "
                f"exposed_by {b1['exposed_by']}; workaround {b1['workaround']}; peak {b1['peak'] / 2**20:.0f} MiB")
        if not all(t in r for t in ("bt_w1_k1", f"bt_w{n}_k{n}", f"np_w1_k{n}", f"np_w{n}_k{n}")):
            continue
        b1, bd, bk, bn = r["bt_w1_k1"], r[f"bt_w{n}_k{n}"], r[f"np_w1_k{n}"], r[f"np_w{n}_k{n}"]
        same = bk["steps"] == bn["steps"] and bk["culprits"] == bn["culprits"] and bk["whole"] == bn["whole"]
        peer_text = (f"debug reduce bisect / bisect-tui: {pg['wall'] / b1['wall']:.1f}x (1 worker), "
                     f"{pg['wall'] / bd['wall']:.1f}x ({n} workers, fanout {n}); ") if pg else ""
        summary.append(
            f"{name}: {peer_text}search alone (bisect.seconds) "
            f"{b1['search_s']:.2f} s / {bd['search_s']:.2f} s; without the probe {bk['search_s']:.2f} s (1 worker) / "
            f"{bn['search_s']:.2f} s ({n} workers), "
            f"{n}-worker speed-up on the same builds (no probe): whole command {bk['wall'] / bn['wall']:.2f}x, "
            f"search {bk['search_s'] / max(bn['search_s'], 1e-9):.2f}x (bound from its rounds "
            f"{sum(bk['round_sizes']) / sum(math.ceil(k / n) for k in bk['round_sizes']):.2f}x: "
            f"{sum(1 for k in bk['round_sizes'] if k == 1)} lone builds, "
            f"{sum(1 for k in bk['round_sizes'] if k > 1)} rounds of {n}); steps identical: {'yes' if same else 'NO'}; "
            f"workers seen: {bn['workers_used']}; passes named: {b1['passes']}; cores free for 2 CPU-bound "
            f"processes before / after this model's rows: {r['cores_free'][0]} / {r['cores_free'][1]}")
    print()
    for s in summary:
        print(s)
    if args.repeat > 1:
        print("\nall runs (wall s of the whole command; search s):")
        for name, info, r in rows:
            for tag in (t for t in r if t.startswith(("bt", "np"))):
                print(f"  {name} {tag}: wall {[round(w, 2) for w in r[tag]['walls']]}; "
                      f"search {[round(v, 2) for v in r[tag]['search_all']]}")
            if "pg_bisect" in r:
                print(f"  {name} debug reduce bisect: wall {[round(w, 2) for w in r['pg_bisect']['walls']]}")
    if dump:
        bt_rate = dump["bytes"] / dump["bt_s"] / 2**20
        np_rate = dump["bytes"] / dump["np_s"] / 2**20
        print(f"\nbaseline dump: {dump['files']} tensors, {dump['bytes'] / 2**20:.0f} MiB: bisect-tui {dump['bt_s']:.2f} s "
              f"({bt_rate:.0f} MiB/s, running the model included) vs numpy.save of the same arrays from memory "
              f"{dump['np_s']:.2f} s ({np_rate:.0f} MiB/s): {100 * bt_rate / np_rate:.0f}% of numpy.save")
    print(f"load average {os.getloadavg()[0]:.2f} at the end (the machine is shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
