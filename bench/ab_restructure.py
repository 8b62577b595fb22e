"""A/B benchmark: the same bisect-tui commands on two source trees, alternating.

Issue 20 asked that the restructuring leave every benchmark "no slower". This script
times one tree against another (by default d1671db, the last commit before the
restructuring, checked out as a worktree, against this checkout) on the models of
bench/scale_models.py, with the same venv for both, and compares their answers.

    git worktree add /work/wt-old d1671db
    .venv/bin/python bench/ab_restructure.py --old /work/wt-old [--new .] [--runs 7]
        [--models transformer_100,transformer_5000] [--commands bisect,check] [--importtime]

Why it is built the way it is:
- Each run is a fresh process with `PYTHONPATH=<tree>` and its cwd in a temporary folder
  outside both trees (a cwd inside one would put that tree first on sys.path and shadow
  PYTHONPATH). Both trees are byte-compiled first, as a pip install would be.
- The machine these run on is shared, so wall time alone says little: each run also
  records the CPU time (user + sys) of its process tree, from `getrusage(RUSAGE_CHILDREN)`
  around it (the runs are sequential, so the difference is that run's tree). Medians of each.
- The two trees take turns in the order A B B A A B ..., so a drift in the machine's load
  falls on both alike.
- Every run gets a fresh session folder (no steps reused from an earlier run).
- "Same answer" (as in docs/benchmarks.md section 3b): the exit code, each culprit's fused
  node, original nodes, passes and `exposed_by`, and the workaround's disabled passes with
  its full-engine verdict, from the `--json` results.
- "Same JSON", stricter: the whole `--json` outputs are equal once the fields that cannot
  be equal are dropped: timings and timestamps, session paths, the step cache keys (by
  design the new keys do not hold the search's config), and keys the new tree adds
  (listed, never counted as a difference: the contract lets a release add keys). A key
  the new tree drops, or any other value that differs, is a difference (a search that
  takes other steps to the same answer differs here: issue 24 changed the two-culprit
  search on purpose).
- `--importtime`: `python -X importtime -m bisect_tui --help` in both trees, the modules
  imported and the total self time of bisect_tui's own modules and of all modules.

Prints a Markdown table; asserts nothing (exit 1 only when an answer differs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scale_models import MODELS, build, ort_config  # noqa: E402

# fields that differ between any two runs of one tree
VOLATILE = {"seconds", "started", "finished", "checked_at", "key", "wall", "elapsed"}


def run_once(tree: Path, args: list[str], cwd: Path, timeout: float) -> dict:
    """One command in a fresh process; its wall time and its process tree's CPU time."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"rc": p.returncode, "wall": wall, "cpu": cpu, "stdout": p.stdout, "stderr": p.stderr}


def flatten(x, prefix=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from flatten(v, f"{prefix}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, x


def normalised(doc: dict, session: Path) -> dict[str, object]:
    out = {}
    for path, value in flatten(doc):
        last = re.sub(r"\[\d+\]$", "", path).rsplit(".", 1)[-1]
        if last in VOLATILE:
            continue
        if isinstance(value, str):
            value = value.replace(str(session), "<session>").replace(session.name, "<session>")
        out[path] = value
    return out


def compare(old: dict, new: dict) -> tuple[list[str], list[str]]:
    """(differences, keys only the new tree writes)."""
    diffs = [f"{k}: {old[k]!r} -> {new.get(k, '<absent>')!r}" for k in old if new.get(k, "<absent>") != old[k]]
    added = [k for k in new if k not in old]
    return diffs, added


def answer(rc: int, doc: dict) -> str:
    """What the command concluded, without how it searched."""
    b = doc.get("bisect") or {}
    culprits = tuple((c.get("fused_node"), tuple(c.get("original_nodes") or ()), tuple(c.get("optimizers") or ()),
                      c.get("exposed_by")) for c in b.get("culprits") or ())
    w = b.get("workaround") or {}
    work = (tuple(w.get("disabled_optimizers") or ()), (w.get("full_engine") or {}).get("passed"))
    outputs = tuple(sorted((k, (v or {}).get("passed")) for k, v in (doc.get("outputs") or {}).items()))
    return json.dumps([rc, doc.get("verdict"), doc.get("failing_outputs"), outputs, culprits, work], sort_keys=True)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def importtime(tree: Path, cwd: Path) -> dict:
    r = run_once(tree, ["-X", "importtime", "-m", "bisect_tui", "--help"], cwd, 120)
    mods = own = total = 0
    for line in r["stderr"].splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if not m:
            continue
        mods += 1
        total += int(m.group(1))
        if m.group(4).startswith("bisect_tui"):
            own += int(m.group(1))
    return {"modules": mods, "self_us": total, "own_us": own, "wall": r["wall"], "cpu": r["cpu"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="the reference tree (a worktree of d1671db)")
    ap.add_argument("--new", type=Path, default=HERE.parent, help="the tree under test (default: this one)")
    ap.add_argument("--models", default="transformer_100,transformer_1000,cnn_1000,ln0_1000,transformer_5000")
    ap.add_argument("--commands", default="bisect,check")
    ap.add_argument("--runs", type=int, default=7, help="runs of each tree per model and command")
    ap.add_argument("--importtime", action="store_true", help="also `-X importtime -m bisect_tui --help`")
    ap.add_argument("--help-runs", type=int, default=0, help="also time `--help` this many times per tree")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for t in trees.values():
        if not (t / "bisect_tui" / "__init__.py").exists():
            raise SystemExit(f"{t} holds no bisect_tui package")
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(t / "bisect_tui")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="ab_restructure_", dir="/tmp"))
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; "
          f"old {trees['old']}, new {trees['new']}; {args.runs} runs each, alternating", flush=True)
    rows, differs = [], False
    try:
        if args.importtime:
            for tag, t in trees.items():
                it = importtime(t, tmp)
                print(f"importtime {tag}: {it['modules']} modules, self time {it['self_us'] / 1e3:.0f} ms "
                      f"(bisect_tui's own {it['own_us'] / 1e3:.0f} ms)", flush=True)
        if args.help_runs:
            hr: dict[str, list] = {"old": [], "new": []}
            for i in range(args.help_runs):
                for tag in (("old", "new") if i % 2 == 0 else ("new", "old")):
                    hr[tag].append(run_once(trees[tag], ["-m", "bisect_tui", "--help"], tmp, 120))
            rows.append(("--help", "", "help", {k: v for k, v in hr.items()}, "-"))
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            model = tmp / f"{name}.onnx"
            info = build(name, model)
            inputs = tmp / f"{name}_x.npz"
            rng = np.random.default_rng(0)
            np.savez(inputs, **{k: rng.standard_normal(v).astype(np.float32) for k, v in info["input"].items()})
            setting = ort_config(name)
            for command in [c.strip() for c in args.commands.split(",") if c.strip()]:
                runs: dict[str, list] = {"old": [], "new": []}
                answers: dict[str, list] = {"old": [], "new": []}
                concl: dict[str, list] = {"old": [], "new": []}
                print(f"{name} ({info['nodes']} nodes) {command}:", end=" ", flush=True)
                for i in range(args.runs):
                    order = ("old", "new") if i % 2 == 0 else ("new", "old")
                    for tag in order:
                        sess = tmp / f"s_{tag}_{name}_{command}_{i}"
                        out = tmp / f"{tag}_{name}_{command}_{i}.json"
                        cmd = ["-m", "bisect_tui", command, str(model), "--input", str(inputs),
                               *(["--ort-config", setting] if setting else []),
                               "--session", str(sess), "--json", str(out), "-q"]
                        if command == "bisect":
                            cmd += ["--workers", "1", "--fanout", "1"]
                        r = run_once(trees[tag], cmd, tmp, args.timeout)
                        if r["rc"] not in (0, 1) or not out.exists():
                            raise SystemExit(f"{tag} {name} {command} failed ({r['rc']}):\n{r['stderr'][-2000:]}")
                        runs[tag].append(r)
                        doc = json.loads(out.read_text())
                        answers[tag].append((r["rc"], normalised(doc, sess)))
                        concl[tag].append(answer(r["rc"], doc))
                        shutil.rmtree(sess, ignore_errors=True)
                        print(f"{tag[0]}{r['wall']:.2f}/{r['cpu']:.2f}", end=" ", flush=True)
                print(flush=True)
                # every run of both trees against the old tree's first answer
                ref_rc, ref = answers["old"][0]
                notes, added = [], set()
                for tag in ("old", "new"):
                    for rc, doc in answers[tag]:
                        diffs, extra = compare(ref, doc)
                        added.update(extra)
                        if rc != ref_rc:
                            diffs.insert(0, f"exit code {ref_rc} -> {rc}")
                        notes.extend(f"{tag}: {d}" for d in diffs)
                same_json = "yes" if not notes else "no"
                same = "yes" if len(set(concl["old"] + concl["new"])) == 1 else "NO"
                if same != "yes":
                    print("   answers:", sorted(set(concl["old"] + concl["new"]), key=repr))
                differs |= same != "yes"
                for n in sorted(set(notes))[:20]:
                    print("   differs:", n)
                if added:
                    print(f"   keys only the new tree writes ({len(added)}): "
                          + ", ".join(sorted({re.sub(r'\[\d+\]', '[]', a) for a in added}))[:600])
                rows.append((name, info["nodes"], command, runs, f"{same} / {same_json}"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print("| model | nodes | command | wall before | wall after | after/before | CPU before | CPU after | "
          "after/before | n | same answer / JSON |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, nodes, command, runs, same in rows:
        w = {k: median([r["wall"] for r in v]) for k, v in runs.items()}
        c = {k: median([r["cpu"] for r in v]) for k, v in runs.items()}
        print(f"| {name} | {nodes:,} | {command} | {w['old']:.2f} s | {w['new']:.2f} s | {w['new'] / w['old']:.2f} | "
              f"{c['old']:.2f} s | {c['new']:.2f} s | {c['new'] / c['old']:.2f} | {len(runs['new'])} | {same} |"
              if nodes != "" else
              f"| {name} | | {command} | {w['old']:.2f} s | {w['new']:.2f} s | {w['new'] / w['old']:.2f} | "
              f"{c['old']:.2f} s | {c['new']:.2f} s | {c['new'] / c['old']:.2f} | {len(runs['new'])} | {same} |")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
