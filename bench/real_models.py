"""Real models from PyPI wheels through check and bisect, each conclusion re-derived.

The models ship inside wheels people install (rapidocr-onnxruntime, silero-vad,
nudenet, ddddocr), so nothing is committed: `pip download --no-deps
--only-binary=:all:` puts the wheels in ~/.cache/bisect-tui-corpus/wheels and
their .onnx files are unzipped beside them. Each model is checked in FP32 (ORT),
FP16 (ORT --precision fp16) and on OpenVINO; every failing run is bisected. Then
each conclusion is recomputed here with the libraries alone, never with
bisect-tui's search or judge: a pass by the plain engine against plain ORT FP32, a
keep-set by onnxruntime's FP16 converter with that block list plus the cast repair
the repro bundle ships as a standalone file (engines/ort/fp16.py), a workaround by a
plain ORT session with those optimizers disabled, "not a fusion" by the engine
with every fusion blocked (ORT_DISABLE_ALL; OpenVINO with every tensor a graph
output). Where the two disagree the table says so: that is the point of it.

    python bench/real_models.py [--only NAME] [--markdown FILE] [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("BISECT_TUI_CORPUS", Path.home() / ".cache" / "bisect-tui-corpus"))
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Model:
    name: str
    wheel: str  # the PyPI project
    member: str  # the .onnx file inside the wheel
    args: list[str] = field(default_factory=list)  # the dynamic-dim hints check asks for


MODELS = [
    Model("PP-OCRv4 det", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
          ["--shape", "x=1x3x320x320"]),
    Model("PP-OCRv4 rec", "rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
          ["--shape", "x=1x3x48x320"]),
    Model("PP-OCR cls v2.0", "rapidocr-onnxruntime",
          "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", ["--shape", "x=1x3x48x192"]),
    Model("Silero VAD", "silero-vad", "silero_vad/data/silero_vad.onnx",
          ["--shape", "input=1x512", "--shape", "state=2x1x128", "--input-value", "sr=16000"]),
    Model("NudeNet 320n", "nudenet", "nudenet/320n.onnx", ["--shape", "images=1x3x320x320"]),
    Model("ddddocr common_old", "ddddocr", "ddddocr/common_old.onnx", ["--shape", "input1=1x1x64x128"]),
    Model("ddddocr common", "ddddocr", "ddddocr/common.onnx", ["--shape", "input1=1x1x64x128"]),
    Model("ddddocr common_det", "ddddocr", "ddddocr/common_det.onnx"),
    Model("Silero VAD 16k op15", "silero-vad", "silero_vad/data/silero_vad_16k_op15.onnx",
          ["--shape", "input=1x512", "--shape", "state=2x1x128", "--input-value", "sr=16000"]),
    Model("Silero VAD half", "silero-vad", "silero_vad/data/silero_vad_half.onnx",
          ["--shape", "input=1x512", "--shape", "state=2x1x128"]),
    Model("Silero VAD op18 ifless", "silero-vad", "silero_vad/data/silero_vad_op18_ifless.onnx",
          ["--shape", "input=1x512", "--shape", "state=2x1x128", "--input-value", "sr=16000"]),
    Model("Silero VAD 16k sequence", "silero-vad", "silero_vad/data/silero_vad_16k_sequence.onnx",
          ["--shape", "input=4x576"]),
    Model("Silero VAD openvino 16k", "silero-vad", "silero_vad/data/silero_vad_openvino_16k.onnx"),
]
# what the wheels also hold and this run leaves out (time on a shared 2-core machine)
# what the wheels also hold and this run leaves out
SKIPPED: list[str] = []
RUNS = [("ORT FP32", ["--engine", "ort"]), ("ORT FP16", ["--engine", "ort", "--precision", "fp16"]),
        ("OpenVINO", ["--engine", "openvino"])]


def fetch(model: Model) -> Path:
    wheels, models = CACHE / "wheels", CACHE / "models"
    dest = models / Path(model.member).name
    if dest.exists():
        return dest
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(model.wheel.replace("-", "_") + "-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        model.wheel, "-d", str(wheels)], check=True)
        found = sorted(wheels.glob(model.wheel.replace("-", "_") + "-*.whl"))
    models.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[-1]) as z:
        dest.write_bytes(z.read(model.member))
    return dest


def wheel_of(model: Model) -> str:
    found = sorted((CACHE / "wheels").glob(model.wheel.replace("-", "_") + "-*.whl"))
    return found[-1].name if found else "?"


def tool(argv: list[str], timeout: float) -> tuple[int, dict, float, str]:
    """bisect-tui in its own process, as a user runs it; its JSON and its last line."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    json_path = Path(argv[argv.index("--session") + 1]) / f"bench_{argv[0]}.json"
    t = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "bisect_tui.cli", *argv, "--json", str(json_path)],
                           capture_output=True, text=True, timeout=timeout, env=env)
        code, tail = p.returncode, (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:] or [""]
    except subprocess.TimeoutExpired:
        code, tail = -1, [f"stopped after {timeout:.0f} s"]
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    return code, data, time.monotonic() - t, tail[0][:200]


# ---- the independent side: onnx, onnxruntime, openvino and numpy only ----

def _inputs(session_dir: Path) -> dict[str, np.ndarray]:
    with np.load(session_dir / "input.npz", allow_pickle=False) as z:
        return {k: np.asarray(z[k][0]) for k in z.files}  # sample 0 (the tool stores a leading samples axis)


def _ort(model, feeds, level="disable", disabled=()):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    blob = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    s = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled))
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


def _fp16(path: Path, keep=()):
    """The FP16 model as a user rebuilds it: onnxruntime's converter; with a keep-set,
    the converter plus the repair the bundle ships (engines/ort/fp16.py, which needs
    only onnx and onnxruntime: the converter alone rounds a kept node's inputs to FP16
    on the way in, so no keep-set could pass with it). Plain ORT runs the result."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    if keep:
        from bisect_tui.engines.ort.fp16 import convert

        return convert(onnx.load(str(path)), list(keep))[0]
    return convert_float_to_float16(onnx.load(str(path)), keep_io_types=True, node_block_list=list(keep))


def _openvino(model, feeds, mark_all=False):
    import onnx
    import openvino as ov

    m = onnx.load(str(model))
    if mark_all:  # every tensor a graph output: no fusion can span one
        have = {o.name for o in m.graph.output} | {i.name for i in m.graph.input}
        made = dict.fromkeys(t for n in m.graph.node for t in n.output if t and t not in have)
        m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in made)
    import tempfile

    core = ov.Core()
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(m, f"{tmp}/m.onnx")
        compiled = core.compile_model(core.read_model(f"{tmp}/m.onnx"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    res = compiled(feeds)
    return {o.get_any_name(): np.asarray(v) for o, v in res.items()}


def _judge(got: dict, ref: dict, tol: dict) -> tuple[bool, float]:
    """Element-wise atol + rtol*|ref| and the cosine floor, over the reference's float outputs."""
    ok, worst = True, 0.0
    for name, r in ref.items():
        if not (isinstance(r, np.ndarray) and r.dtype.kind == "f") or name not in got:
            continue
        g, r = np.asarray(got[name], np.float64), r.astype(np.float64)
        diff = np.abs(g - r)
        worst = max(worst, float(np.nanmax(diff)) if diff.size else 0.0)
        ok &= bool(np.all(diff <= tol["atol"] + tol["rtol"] * np.abs(r)))
        denom = np.linalg.norm(g) * np.linalg.norm(r)
        # a reference below atol everywhere: cosine measures rounding noise, the element test decides
        # (the rule docs/bisect.md states; 1.5e-7 off on PP-OCRv4 det's near-empty map is cosine 0.9998)
        if tol.get("min_cosine") and r.size > 1 and denom > 0 and np.abs(r).max() >= tol["atol"]:
            ok &= bool(float(g.ravel() @ r.ravel()) / denom >= tol["min_cosine"])
    return ok, worst


def _first(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:220]}"


def verify(run: str, verdict: str, check: dict, bisect: dict, session: Path, tol: dict) -> str:
    """Re-derive the conclusion; returns what the independent computation found."""
    import onnx

    prepared = session / "model.onnx"
    feeds = _inputs(session)
    ref = _ort(prepared, feeds)  # plain ORT FP32, nothing fused
    fp16 = run == "ORT FP16"

    def full(disabled=(), keep=(), level="all"):
        if run == "OpenVINO":
            return _openvino(prepared, feeds)
        return _ort(_fp16(prepared, keep) if fp16 else prepared, feeds, level, disabled)

    def control() -> str:  # the keep-set search's own control, recomputed: every node kept in FP32
        if not fp16:
            return ""
        every = [n.name for n in onnx.load(str(prepared)).graph.node]
        try:
            ok, worst = _judge(full(keep=every), ref, tol)
        except Exception as exc:
            return f"; every node kept in FP32: {_first(exc)}"
        return f"; every node kept in FP32: max_abs {worst:.3g} ({'passes' if ok else 'fails'})"

    b = bisect or {}
    precision, err = b.get("precision") or {}, check.get("engine_error") or b.get("engine_error")
    disabled = (b.get("workaround") or {}).get("disabled_optimizers") or []
    try:
        if err and not precision.get("keep_fp32") and not disabled:
            try:
                full()
            except Exception as exc:  # the plain engine cannot build or run either: the error is real
                return (f"agrees that the engine fails: plain {run} fails too ({_first(exc)}); "
                        f"'{verdict}' names no numeric cause{control()}")
            ok, worst = _judge(full(), ref, tol)
            return (f"DISAGREES: plain {run} builds and runs this model: max_abs {worst:.3g} "
                    f"({'passes' if ok else 'fails'})")
        try:
            ok, worst = _judge(full(), ref, tol)
        except Exception as exc:
            if not err:
                raise
            # the engine's failure, recomputed: the plain engine fails too; what follows must make it build
            ok, worst, alone = False, float("inf"), f"plain engine alone fails too ({_first(exc)}); "
        else:
            alone = f"plain engine alone: max_abs {worst:.3g} ({'passes: the failure is not reproduced' if ok else 'fails'}); "
        if verdict == "pass":
            return f"{'agrees' if ok else 'DISAGREES'}: plain engine max_abs {worst:.3g}"
        if precision.get("keep_fp32"):
            ok, worst = _judge(full(keep=precision["keep_fp32"]), ref, tol)
            return (f"{alone}{'agrees' if ok else 'DISAGREES'}: converter with this keep-set, plain ORT: "
                    f"max_abs {worst:.3g} ({'passes' if ok else 'fails'}){control()}")
        if disabled and run != "OpenVINO":
            ok, worst = _judge(full(disabled=disabled), ref, tol)
            return (f"{alone}{'agrees' if ok else 'DISAGREES'}: plain ORT with {', '.join(disabled)} disabled: "
                    f"max_abs {worst:.3g} ({'passes' if ok else 'fails'})")
        if run == "OpenVINO":
            got, how = _openvino(prepared, feeds, mark_all=True), "OpenVINO with every tensor an output"
        else:
            got, how = full(level="disable"), "ORT_DISABLE_ALL" + (" on the FP16 conversion" if fp16 else "")
        ok, worst = _judge(got, ref, tol)
        found = f"{how}: max_abs {worst:.3g} ({'passes: a fusion is the cause' if ok else 'still fails'})"
        if verdict == "not_fusion":
            return f"{alone}{'DISAGREES' if ok else 'agrees'}: {found}{control()}"
        return f"{alone}the tool concluded nothing; {found}{control()}"
    except Exception as exc:  # the independent side failing is a finding too
        return f"could not recompute: {_first(exc)}"


def conclusion(check: dict, bisect: dict) -> str:
    b = bisect or {}
    parts = []
    for c in b.get("culprits") or []:
        what = c.get("fused_node") or f"{len(c.get('original_nodes') or [])} original node(s)"
        parts.append(f"{c.get('kind', 'fusion')}: {what} ({', '.join(c.get('optimizers') or []) or 'no pass'})")
    keep = (b.get("precision") or {}).get("keep_fp32")
    if keep:
        parts.append(f"keep-set of {len(keep)}: {', '.join(keep[:4])}{' ...' if len(keep) > 4 else ''}")
    disabled = (b.get("workaround") or {}).get("disabled_optimizers")
    if disabled:
        parts.append("workaround: disable " + ", ".join(disabled))
    err = check.get("engine_error") or b.get("engine_error")
    if err:
        parts.append(f"engine error ({err.get('kind')}): {' '.join(str(err.get('message', '')).split())[:160]}")
    if b.get("error"):
        parts.append(f"bisect stopped: {b['error']}")
    return "; ".join(parts) or "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="run only models whose name contains this")
    ap.add_argument("--markdown", type=Path, help="write the table here too")
    ap.add_argument("--budget", type=float, default=1200, help="stop starting runs after this many seconds")
    ap.add_argument("--work", type=Path, default=CACHE / "sessions")
    ap.add_argument("--reuse", action="store_true",
                    help="resume the sessions an earlier run left in --work instead of starting each afresh "
                         "(their steps would be replayed, verdicts of older code or another host included)")
    args = ap.parse_args()
    import onnxruntime
    import openvino

    started = time.monotonic()
    rows, left_out = [], list(SKIPPED)
    for model in MODELS:
        if args.only and not any(o.lower() in model.name.lower() for o in args.only):
            continue
        path = fetch(model)
        for run, engine_args in RUNS:
            if time.monotonic() - started > args.budget:
                left_out.append(f"{model.name} {run} (over the {args.budget:.0f} s budget)")
                continue
            session = args.work / f"{path.stem}-{run.replace(' ', '_')}"
            if not args.reuse and session.is_dir() and not session.is_symlink():
                shutil.rmtree(session)
            common = [str(path), "--session", str(session), "-q", "--no-determinism", *engine_args, *model.args]
            code, check, secs, tail = tool(["check", *common], timeout=300)
            verdict, bis = check.get("verdict", f"exit {code}"), {}
            if code == 1:
                bcode, bdata, bsecs, btail = tool(["bisect", *common, "--max-builds", "40"], timeout=420)
                bis = bdata.get("bisect") or {}
                verdict, secs, tail = bis.get("verdict", f"bisect exit {bcode}"), secs + bsecs, btail
                if bcode not in (0, 1):
                    bis = dict(bis, error=btail)
            tol = (check.get("tolerance") or {}).get("default") or {}
            checked = verify(run, verdict, check, bis, session, tol) if tol and (session / "input.npz").exists() \
                else f"not recomputed ({tail})"
            rows.append((model.name, run, f"{verdict} (exit {code})", conclusion(check, bis), checked, secs))
            print(f"{model.name} | {run} | {verdict} | {conclusion(check, bis)} | {checked} | {secs:.0f}s",
                  flush=True)
    lines = [f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()} ({os.cpu_count()} cores, shared), "
             f"onnxruntime {onnxruntime.__version__}, openvino {openvino.__version__.split('-')[0]}; wheels: "
             + ", ".join(sorted({wheel_of(m) for m in MODELS})) + ".", "",
             "| model | engine/precision | verdict | culprit / keep-set / workaround | independent check | time |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {m} | {r} | {v} | {c.replace('|', '/')} | {k.replace('|', '/')} | {s:.0f} s |"
              for m, r, v, c, k, s in rows]
    lines += ["", "Left out: " + ("; ".join(left_out) if left_out else "nothing the four wheels hold") + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
