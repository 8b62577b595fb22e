"""Hostile inputs, table-driven: crafted models, input files, options, edited
session directories, resource faults and interruptions.

Every case asserts the exit code, the one-line message (never a traceback),
that nothing outside the session changed (a canary directory next to it,
snapshotted by content) and that nothing inside it was lost. The cases run
`cli.main` in-process on one small model; subprocesses only where the case
needs a process of its own (file-size limits, a full disk, signals).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisect_tui.cli import main
from bisect_tui.core.errors import ExitCode

from testlib import REPO, init, make_model, vi

H = helper
GELU = ["--ort-config", "optimization.enable_gelu_approximation=1"]
EVIL = ('g"""\nopen(__import__("os").environ["CANARY"], "w").write("pwned")\n"""\\x\\N{BULLET}\\u00e9\x1b]0;pwned\x07\x1b[2J'
        '<script>alert(1)</script><img src=x onerror=alert(1)>](javascript:alert(1))`|$x$')


# --------------------------------------------------------------------------- models


def gelu_model(names: Optional[dict] = None) -> onnx.ModelProto:
    """x[8,32] -> MatMul+Add -> erf-Gelu (5 nodes) -> MatMul -> y; the Gelu
    approximation (FastGelu) breaks FP32 tolerance at the Gelu."""
    n = names or {}
    nm = lambda k: n.get(k, k)  # noqa: E731
    t = lambda k: nm(k) + ":0"  # noqa: E731
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((32, 32)) * 2.0 / math.sqrt(32)).astype(np.float32) * 1.5
    b = (rng.standard_normal(32) * 0.1).astype(np.float32)
    W2 = (rng.standard_normal((32, 16)) * 0.2).astype(np.float32)
    nodes = [
        H.make_node("MatMul", ["x", "W"], [t("fc/matmul")], name=nm("fc/matmul")),
        H.make_node("Add", [t("fc/matmul"), "b"], [t("fc/bias")], name=nm("fc/bias")),
        H.make_node("Div", [t("fc/bias"), "sqrt2"], [t("gelu/div")], name=nm("gelu/div")),
        H.make_node("Erf", [t("gelu/div")], [t("gelu/erf")], name=nm("gelu/erf")),
        H.make_node("Add", [t("gelu/erf"), "one"], [t("gelu/add_one")], name=nm("gelu/add_one")),
        H.make_node("Mul", [t("fc/bias"), t("gelu/add_one")], [t("gelu/mul_x")], name=nm("gelu/mul_x")),
        H.make_node("Mul", [t("gelu/mul_x"), "half"], [t("gelu/mul_half")], name=nm("gelu/mul_half")),
        H.make_node("MatMul", [t("gelu/mul_half"), "W2"], [n.get("y", "y")], name=nm("out/matmul")),
    ]
    inits = [init("W", W), init("b", b), init("W2", W2), init("sqrt2", np.float32(math.sqrt(2))),
             init("one", np.float32(1)), init("half", np.float32(0.5))]
    return make_model(nodes, [vi("x", [8, 32])], [vi(n.get("y", "y"), [8, 16])], inits)


def relu_model(inputs=(("x", [2, 3]),), outputs=None, extra_nodes=(), inits=()):
    names = [i for i, _ in inputs]
    nodes = [H.make_node("Relu", [names[0]], ["r"], name="relu"),
             H.make_node("Mul", ["r", names[-1]], ["y"], name="mul"), *extra_nodes]
    outs = outputs if outputs is not None else [vi("y", inputs[0][1])]
    return make_model(nodes, [vi(n, s) for n, s in inputs], outs, list(inits))


def model_bytes(m: onnx.ModelProto) -> bytes:
    return m.SerializeToString()


def m_scalar():
    return make_model([H.make_node("Mul", ["x", "x"], ["a"], name="sq"),
                       H.make_node("Relu", ["a"], ["y"], name="r")], [vi("x", [])], [vi("y", [])])


def m_zero_dim():
    return make_model([H.make_node("Relu", ["x"], ["a"], name="r"),
                       H.make_node("Mul", ["a", "a"], ["y"], name="m")], [vi("x", ["n", 4])], [vi("y", ["n", 4])])


def m_output_is_input():
    return make_model([H.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", [2, 3])],
                      [vi("y", [2, 3]), vi("x", [2, 3])])


def m_constant_output():
    return make_model([H.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", [2, 3])],
                      [vi("y", [2, 3]), vi("c", [3])], [init("c", np.arange(3, dtype=np.float32))])


def m_keyword_inputs():
    names = ["file", "allow_pickle", "args", "kwds"]
    nodes = [H.make_node("Add", ["file", "allow_pickle"], ["a"], name="add"),
             H.make_node("Mul", ["a", "args"], ["b"], name="mul"),
             H.make_node("Sub", ["b", "kwds"], ["y"], name="sub")]
    return make_model(nodes, [vi(n, [2, 3]) for n in names], [vi("y", [2, 3])])


def m_random():
    return make_model([H.make_node("RandomNormalLike", ["x"], ["r"], name="rnd"),
                       H.make_node("Add", ["x", "r"], ["y"], name="add")], [vi("x", [2, 4])], [vi("y", [2, 4])])


def m_nan():
    return make_model([H.make_node("Neg", ["x"], ["n"], name="neg"),
                       H.make_node("Abs", ["x"], ["a"], name="abs"),
                       H.make_node("Neg", ["a"], ["na"], name="negabs"),
                       H.make_node("Sqrt", ["na"], ["y"], name="sqrt")], [vi("x", [2, 4])], [vi("y", [2, 4])])


def m_same_plot_names():
    return make_model([H.make_node("Relu", ["x"], ["a/b"], name="r"),
                       H.make_node("Neg", ["x"], ["a:b"], name="n")], [vi("x", [2, 3])],
                      [vi("a/b", [2, 3]), vi("a:b", [2, 3])])


def m_long_names():
    long = "t" * 5000 + "/../../" + "u" * 300
    return make_model([H.make_node("Relu", ["x"], [long], name="n" * 4000),
                       H.make_node("Neg", [long], ["y"], name="neg")], [vi("x", [2, 3])], [vi("y", [2, 3])])


def m_traversal_names():
    return make_model([H.make_node("Relu", ["x"], ["../../outside/pwned"], name="../../outside/node"),
                       H.make_node("Neg", ["../../outside/pwned"], ["/etc/passwd"], name="/abs/node")],
                      [vi("x", [2, 3])], [vi("/etc/passwd", [2, 3])])


def m_markup_names():
    return make_model([H.make_node("Relu", ["x"], ["[/b][link=file:///etc]x[/link]"], name="[bold]n[/]"),
                       H.make_node("Neg", ["[/b][link=file:///etc]x[/link]"], ["y"], name="neg")],
                      [vi("x", [2, 3])], [vi("y", [2, 3])])


def m_mathtext_output():
    """An output name matplotlib would parse as a (broken) formula in the plot title."""
    return make_model([H.make_node("Relu", ["x"], ["$\\frac{$"], name="r")], [vi("x", [2, 3])],
                      [vi("$\\frac{$", [2, 3])])


def m_no_outputs():
    return make_model([H.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", [2, 3])], [])


def m_no_nodes():
    return make_model([], [vi("x", [2, 3])], [vi("x", [2, 3])])


def m_unknown_op():
    return make_model([H.make_node("NoSuchOp", ["x"], ["y"], name="r")], [vi("x", [2, 3])], [vi("y", [2, 3])])


def m_sequence_input():
    seq = H.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])
    m = make_model([H.make_node("SequenceLength", ["s"], ["y"], name="len")], [seq],
                   [vi("y", [], TensorProto.INT64)])
    return m


def m_string_input():
    return make_model([H.make_node("Identity", ["x"], ["y"], name="id")],
                      [vi("x", [2], TensorProto.STRING)], [vi("y", [2], TensorProto.STRING)])


def m_runtime_failure():
    shape = init("shape", np.array([7, 5], dtype=np.int64))
    return make_model([H.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
                       H.make_node("Relu", ["r"], ["y"], name="relu")], [vi("x", [2, 3])],
                      [vi("y", [7, 5])], [shape])


def m_external_escape():
    m = relu_model()
    t = m.graph.initializer.add()
    t.name = "w"
    t.data_type = TensorProto.FLOAT
    t.dims.extend([2, 3])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../../../../../../etc/passwd"), ("offset", "0"), ("length", "24")):
        e = t.external_data.add()
        e.key, e.value = k, v
    m.graph.node[1].input[1] = "w"
    del m.graph.input[:]
    m.graph.input.extend([vi("x", [2, 3])])
    return m


# --------------------------------------------------------------------------- world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One small model, a finished `check` session and a finished `bisect`
    session of it, made once and copied by the cases that edit sessions."""
    root = tmp_path_factory.mktemp("hostile")
    model = root / "gelu.onnx"
    onnx.save(gelu_model(), model)
    state = root / "state"
    env_before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(state)
    try:
        check_s, bis_s = root / "check-session", root / "bisect-session"
        assert main(["check", str(model), "--session", str(check_s), "-q"]) == 0
        assert main(["bisect", str(model), "--session", str(bis_s), *GELU, "-q",
                     "--json", str(root / "clean-bisect.json")]) == 1
    finally:
        if env_before is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = env_before
    clean = json.loads((root / "clean-bisect.json").read_text())
    return {"root": root, "model": model, "check": check_s, "bisect": bis_s, "clean": clean}


@dataclass
class Ctx:
    tmp: Path
    model: Path
    sess: Path
    outside: Path
    world: dict
    extra: dict = field(default_factory=dict)

    def fmt(self, argv: list[str]) -> list[str]:
        return [a.format(model=self.model, sess=self.sess, out=self.outside, tmp=self.tmp, **self.extra)
                for a in argv]


def tree_digest(d: Path) -> dict:
    """Every entry under `d` by relative name: kind and content hash (links not followed)."""
    out = {}
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d).as_posix()
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        elif p.is_dir():
            out[rel] = ("dir",)
    return out


def _transient(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return (rel.startswith("tmp/") or (name.startswith(".") and name.endswith(".tmp"))
            or (name.startswith(".tmp_") and name.endswith((".npy", ".npz"))))


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err!r}"
    return lines[0]


# --------------------------------------------------------------------------- setups


def use_model(m_fn):
    def setup(ctx: Ctx):
        ctx.model = ctx.tmp / "case.onnx"
        ctx.model.write_bytes(model_bytes(m_fn()))
    return setup


def raw_model(data: bytes, name: str = "case.onnx"):
    def setup(ctx: Ctx):
        ctx.model = ctx.tmp / name
        ctx.model.write_bytes(data)
    return setup


def copy_session(kind: str):
    def setup(ctx: Ctx):
        shutil.copytree(ctx.world[kind], ctx.sess, symlinks=True)
    return setup


def chain(*fns):
    def setup(ctx: Ctx):
        for f in fns:
            f(ctx)
    return setup


class Exploit:
    """Pickled, this object writes the canary when loaded: a loader that
    honoured pickles would run it."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "pwned"))


def pickled_input(ctx: Ctx):
    p = ctx.tmp / "evil.npy"
    arr = np.empty(1, dtype=object)
    arr[0] = Exploit(ctx.outside / "CANARY")
    np.save(p, arr, allow_pickle=True)
    ctx.extra["input"] = str(p)


def pickled_session_inputs(ctx: Ctx):
    p = ctx.sess / "input.npz"
    arr = np.empty(1, dtype=object)
    arr[0] = Exploit(ctx.outside / "CANARY")
    with zipfile.ZipFile(p, "w") as z:
        with z.open("x.npy", "w") as fh:
            np.lib.format.write_array(fh, arr, allow_pickle=True)


def edit_json(rel: str, fn):
    def setup(ctx: Ctx):
        p = ctx.sess / rel
        data = json.loads(p.read_text())
        new = fn(data, ctx)
        p.write_text(json.dumps(new if new is not None else data))
    return setup


def write_file(rel: str, text: str):
    def setup(ctx: Ctx):
        p = ctx.sess / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return setup


def symlink_out(rel: str, target: str = "secret.txt"):
    def setup(ctx: Ctx):
        p = ctx.sess / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(ctx.outside / target)
    return setup


def first_tensor_file(ctx: Ctx) -> Path:
    m = json.loads((ctx.sess / "baseline" / "manifest.json").read_text())
    return ctx.sess / "baseline" / m["tensors"][0]["file"]


def tamper_tensor_same_size(ctx: Ctx):
    p = first_tensor_file(ctx)
    a = np.load(p)
    np.save(p, (a + 1000).astype(a.dtype))  # same header, same size, other values


def tensor_to_symlink(ctx: Ctx):
    p = first_tensor_file(ctx)
    shutil.copy(p, ctx.outside / "planted.npy")
    p.unlink()
    p.symlink_to(ctx.outside / "planted.npy")


def manifest_escape(path_fn):
    def fn(m, ctx):
        planted = ctx.outside / "secret.npy"
        first = m["tensors"][0]
        np.save(planted, np.full([m["samples"], *first["shape"]], 1e6, dtype=np.float32))
        first["file"] = path_fn(ctx)
        return m
    return fn


def flip_steps(ctx: Ctx):
    p = ctx.sess / "bisect" / "steps.jsonl"
    lines = []
    for line in p.read_text().splitlines():
        rec = json.loads(line)
        rec["passed"] = not rec["passed"]  # an edit without a matching digest
        lines.append(json.dumps(rec))
    p.write_text("\n".join(lines) + "\n")


def garbage_steps(ctx: Ctx):
    p = ctx.sess / "bisect" / "steps.jsonl"
    with open(p, "a") as fh:
        fh.write('[1, 2]\n"text"\n{"key": 5}\n{"key": "x", "passed": true}\n{not json\n')


def stale_temps(ctx: Ctx):
    (ctx.sess / "tmp" / "bisect_tui_ort_dead").mkdir(parents=True)
    (ctx.sess / "tmp" / "bisect_tui_ort_dead" / "model.onnx").write_bytes(b"x" * 100)
    (ctx.sess / ".check.json.abc123.tmp").write_text("half")
    (ctx.sess / "baseline" / ".tmp_dead.npy").write_bytes(b"\x93NUMPY")
    (ctx.sess / "baseline" / ".tmp_dead.npz").write_bytes(b"PK\x03\x04")  # a pack cut by a SIGKILL


def recent_state(content: str):
    def setup(ctx: Ctx):
        state = Path(os.environ["XDG_STATE_HOME"]) / "bisect-tui"
        state.mkdir(parents=True, exist_ok=True)
        (state / "recent.json").write_text(content)
    return setup


def session_is_file(ctx: Ctx):
    ctx.sess.write_text("not a directory")


def json_target_dir(ctx: Ctx):
    (ctx.tmp / "adir").mkdir()


# --------------------------------------------------------------------------- checks


def rendered(md: str) -> str:
    """The report as a CommonMark renderer with raw HTML enabled turns it into HTML
    (markdown-it-py, what Textual's Markdown widget uses)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).enable("table").render(md)


def report_is_inert(ctx: Ctx, out: str, err: str):
    md = (ctx.tmp / "r.md").read_text()
    html = rendered(md)
    allowed = {"p", "h1", "h2", "h3", "h4", "ul", "li", "code", "pre", "table", "thead", "tbody", "tr", "th",
               "td", "strong", "em", "img", "br", "hr"}
    for tag, attrs in re.findall(r"<([a-zA-Z][a-zA-Z0-9]*)([^>]*)>", html):
        assert tag.lower() in allowed, f"a model name made a <{tag}> tag"
        assert not re.search(r"\bon\w+\s*=|javascript:", attrs, re.I), f"<{tag}{attrs}>"
        if tag == "img":
            assert re.fullmatch(r' src="[\w./-]+\.png" alt="[^"]*" ?/?', attrs), attrs
    assert "<a " not in html, "no link may come from a model name"
    assert "g&quot;&quot;&quot;" in html and "&lt;script&gt;" in html  # the name is shown, as inert text
    assert "\x1b" not in md and "\x07" not in md
    assert "\x1b" not in out and "\x07" not in out
    # one line per name: a newline inside a name cannot forge a line of output
    assert not any(line.startswith('open(__import__') for line in out.splitlines())


def bundle_is_inert(ctx: Ctx, out: str, err: str):
    report_is_inert(ctx, out, err)
    assert "\\x1b" in out  # the culprit's names are printed with the escape shown, not sent
    dest = ctx.tmp / "unzipped"
    with zipfile.ZipFile(ctx.tmp / "b.zip") as z:
        z.extractall(dest)
    script = (dest / "repro" / "repro.py").read_text()
    assert "CANARY" not in script and "pwned" not in script  # nothing from the model in the source
    spec = json.loads((dest / "repro" / "repro.json").read_text())
    assert any("CANARY" in n for n in spec["original_nodes"])  # ... it is data in the JSON
    env = {**os.environ, "CANARY": str(ctx.outside / "CANARY")}
    bad = subprocess.run([sys.executable, str(dest / "repro" / "repro.py")], capture_output=True, text=True,
                         env=env, cwd=dest)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "bug present" in bad.stdout and "Traceback" not in bad.stderr
    ok = subprocess.run([sys.executable, str(dest / "repro" / "repro.py"), "--disable", "GeluApproximation"],
                        capture_output=True, text=True, env=env, cwd=dest)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert not (ctx.outside / "CANARY").exists()
    assert not (dest / "CANARY").exists()


def keyword_inputs_kept(ctx: Ctx, out: str, err: str):
    with np.load(ctx.sess / "input.npz", allow_pickle=False) as z:
        assert sorted(z.files) == ["allow_pickle", "args", "file", "kwds"]
        assert all(z[k].shape == (1, 2, 3) for k in z.files)


def scalar_ok(ctx: Ctx, out: str, err: str):
    r = json.loads((ctx.tmp / "r.json").read_text())
    assert r["inputs"]["arrays"][0]["shape"] == []
    assert r["sensitivity"]["outputs"]["y"]["passed"] is True
    m = json.loads((ctx.sess / "baseline" / "manifest.json").read_text())
    assert all(e["shape"] == [] for e in m["tensors"])  # rank 0 stays rank 0


def zero_dim_ok(ctx: Ctx, out: str, err: str):
    r = json.loads((ctx.tmp / "r.json").read_text())
    assert r["outputs"]["y"]["metrics"]["numel"] == 0 and r["outputs"]["y"]["passed"]


def passthrough_ok(ctx: Ctx, out: str, err: str):
    r = json.loads((ctx.tmp / "r.json").read_text())
    assert set(r["outputs"]) >= {"y", "x"} and r["outputs"]["x"]["metrics"]["max_abs"] == 0


def both_plots_kept(ctx: Ctx, out: str, err: str):
    # one value-histogram plot per output (the error along the graph is a third picture)
    plots = sorted(p.name for p in (ctx.sess / "plots").iterdir() if p.name != "error-along-graph.png")
    assert len(plots) == 2 and plots[0] != plots[1], plots
    md = (ctx.tmp / "r.md").read_text()
    for p in plots:
        assert f"plots/{p})" in md


def recomputed_said(ctx: Ctx, out: str, err: str):
    assert re.search(r"1 saved tensor file\(s\) failed their digest check and were recomputed", out), out
    m = json.loads((ctx.sess / "baseline" / "manifest.json").read_text())
    assert all("/" not in e["file"] for e in m["tensors"])
    from bisect_tui.core.baseline import entry_problem

    assert all(entry_problem(ctx.sess / "baseline", e, m["samples"]) is None for e in m["tensors"])


def same_bisect_as_clean(ctx: Ctx, out: str, err: str):
    r = json.loads((ctx.tmp / "r.json").read_text())
    clean = ctx.world["clean"]["bisect"]
    assert r["bisect"]["verdict"] == clean["verdict"] == "culprits"
    assert [c["original_nodes"] for c in r["bisect"]["culprits"]] == [c["original_nodes"] for c in clean["culprits"]]
    assert r["bisect"]["workaround"]["disabled_optimizers"] == clean["workaround"]["disabled_optimizers"]


def steps_recomputed(ctx: Ctx, out: str, err: str):
    same_bisect_as_clean(ctx, out, err)
    r = json.loads((ctx.tmp / "r.json").read_text())
    assert r["bisect"]["untrusted_steps"] >= 3
    assert "failed their digest check and were recomputed" in out


def temps_swept(ctx: Ctx, out: str, err: str):
    assert not list((ctx.sess / "tmp").iterdir()) if (ctx.sess / "tmp").exists() else True
    assert not (ctx.sess / ".check.json.abc123.tmp").exists()
    assert not (ctx.sess / "baseline" / ".tmp_dead.npy").exists()
    assert not (ctx.sess / "baseline" / ".tmp_dead.npz").exists()


def recent_list_safe(ctx: Ctx, out: str, err: str):
    from bisect_tui.core.session import recent_sessions

    rec = recent_sessions()
    assert isinstance(rec, list) and all(isinstance(e, dict) for e in rec)
    assert any(Path(e["session"]).resolve() == ctx.sess.resolve() for e in rec)


def untouched_session(ctx: Ctx, out: str, err: str):
    assert not ctx.sess.exists()  # refused before any work: not even created


def crash_log_in_session(ctx: Ctx, out: str, err: str):
    line = one_line(err)
    m = re.search(r"traceback in (\S+\.log)", line)
    assert m, line
    log = Path(m.group(1))
    assert log.parent == ctx.sess / "log" and "Traceback" in log.read_text()


# --------------------------------------------------------------------------- the table


@dataclass
class Case:
    id: str
    argv: list[str]
    code: int
    msg: Optional[str] = None  # regex the one stderr line must match
    setup: Optional[Callable[[Ctx], None]] = None
    check: Optional[Callable[[Ctx, str, str], None]] = None


CHECK = ["check", "{model}", "--session", "{sess}", "-q"]
FAST = [*CHECK, "--no-determinism"]
BISECT = ["bisect", "{model}", "--session", "{sess}", *GELU, "-q"]

CASES = [
    # --- model files
    Case("model-missing", ["check", "{tmp}/nope.onnx", "--session", "{sess}", "-q"], 2, "model file not found"),
    Case("model-is-dir", ["check", "{tmp}", "--session", "{sess}", "-q"], 2, "is a directory"),
    Case("model-empty", FAST, 2, "not an ONNX model", raw_model(b"")),
    Case("model-garbage", FAST, 2, "not an ONNX model", raw_model(os.urandom(512) + b"\xff" * 64)),
    Case("model-truncated", FAST, 2, "not an ONNX model|invalid ONNX",
         raw_model(model_bytes(gelu_model())[:700])),
    Case("model-json-text", FAST, 2, "not an ONNX model|invalid ONNX", raw_model(b'{"graph": "nope"}')),
    Case("model-no-nodes", FAST, 2, "no nodes|no graph", use_model(m_no_nodes)),
    Case("model-no-outputs", FAST, 2, "declares no graph outputs", use_model(m_no_outputs)),
    Case("model-unknown-op", FAST, 2, "invalid ONNX model|ONNX Runtime could not load", use_model(m_unknown_op)),
    Case("model-sequence-input", FAST, 2, "not a tensor", use_model(m_sequence_input)),
    Case("model-string-input", FAST, 2, "cannot generate", use_model(m_string_input)),
    Case("model-fails-at-runtime", FAST, 2, "ONNX Runtime", use_model(m_runtime_failure)),
    Case("model-external-data-escapes", FAST, 2, "not an ONNX model|invalid ONNX|external",
         use_model(m_external_escape)),
    # --- shapes handled for real
    Case("scalar-input", [*CHECK, "--json", "{tmp}/r.json"], 0, None, use_model(m_scalar), scalar_ok),
    Case("zero-size-dim", [*FAST, "--shape", "x=0x4", "--json", "{tmp}/r.json"], 0, None, use_model(m_zero_dim),
         zero_dim_ok),
    Case("output-is-input", [*FAST, "--json", "{tmp}/r.json"], 0, None, use_model(m_output_is_input),
         passthrough_ok),
    Case("constant-output", FAST, 0, None, use_model(m_constant_output)),
    Case("numpy-keyword-inputs", FAST, 0, None, use_model(m_keyword_inputs), keyword_inputs_kept),
    Case("same-plot-names", [*FAST, "--report", "{tmp}/r.md"], 0, None, use_model(m_same_plot_names),
         both_plots_kept),
    Case("long-names", FAST, 0, None, use_model(m_long_names)),
    Case("traversal-names", [*FAST, "--report", "{tmp}/r.md"], 0, None, use_model(m_traversal_names)),
    Case("mathtext-output-name", [*FAST, "--report", "{tmp}/r.md"], 0, None, use_model(m_mathtext_output),
         lambda ctx, out, err: (ctx.sess / "plots" / "frac.png").stat().st_size > 1000),
    Case("markup-names", [*FAST, "--report", "{tmp}/r.md"], 0, None, use_model(m_markup_names)),
    Case("unseeded-random-is-caught", CHECK, 3, None, use_model(m_random)),
    Case("nan-in-baseline", FAST, 4, None, use_model(m_nan)),
    # --- names that attack the report, the terminal and repro.py
    Case("evil-names-check", ["check", "{model}", "--session", "{sess}", *GELU, "-q", "--no-determinism",
                              "--report", "{tmp}/r.md"], 1, None,
         use_model(lambda: gelu_model({"gelu/erf": EVIL, "gelu/div": EVIL + "d"})), report_is_inert),
    Case("evil-names-bundle", [*BISECT, "--report", "{tmp}/r.md", "--bundle", "{tmp}/b.zip"], 1, None,
         use_model(lambda: gelu_model({"gelu/erf": EVIL, "gelu/div": EVIL + "d", "fc/bias": "b\\"})),
         bundle_is_inert),
    # --- input files
    Case("input-missing", [*FAST, "--input", "{tmp}/none.npz"], 2, "input file not found"),
    Case("input-is-dir", [*FAST, "--input", "{tmp}"], 2, "input file|cannot read"),
    Case("input-wrong-suffix", [*FAST, "--input", "{tmp}/x.txt"], 2, "must be .npy or .npz",
         lambda ctx: (ctx.tmp / "x.txt").write_text("1 2 3")),
    Case("input-pickle-npy", [*FAST, "--input", "{input}"], 2, "cannot read input file", pickled_input),
    Case("input-corrupt-npz", [*FAST, "--input", "{tmp}/bad.npz"], 2, "cannot read input file",
         lambda ctx: (ctx.tmp / "bad.npz").write_bytes(b"PK\x03\x04garbage")),
    Case("input-missing-name", [*FAST, "--input", "{tmp}/in.npz"], 2, "missing x",
         lambda ctx: np.savez(ctx.tmp / "in.npz", other=np.zeros((8, 32), np.float32))),
    Case("input-wrong-dtype", [*FAST, "--input", "{tmp}/in.npz"], 2, "expects float32",
         lambda ctx: np.savez(ctx.tmp / "in.npz", x=np.zeros((8, 32), np.float64))),
    Case("input-wrong-shape", [*FAST, "--input", "{tmp}/in.npz"], 2, "has shape",
         lambda ctx: np.savez(ctx.tmp / "in.npz", x=np.zeros((8, 31), np.float32))),
    Case("input-zip-slip-names", [*FAST, "--input", "{tmp}/in.npz"], 2, "does not match",
         lambda ctx: zipfile.ZipFile(ctx.tmp / "in.npz", "w").writestr("../../outside/x.npy", b"")),
    Case("input-npy-for-two-inputs", [*FAST, "--input", "{tmp}/in.npy"], 2, "holds one array",
         chain(use_model(m_keyword_inputs), lambda ctx: np.save(ctx.tmp / "in.npy", np.zeros((2, 3), np.float32)))),
    # --- options, validated before any work
    *[Case(f"option-{cid}", [*FAST, *extra], 2, msg, lambda ctx: (ctx.tmp / "afile").write_text("x"),
           untouched_session) for cid, extra, msg in [
        ("max-memory-inf", ["--max-memory", "inf"], "finite size"),
        ("max-memory-negative", ["--max-memory=-1G"], "finite size"),
        ("max-memory-nan", ["--max-memory", "nan"], "finite size|bad memory"),
        ("max-memory-word", ["--max-memory", "lots"], "bad memory size"),
        ("samples-huge", ["--samples", "1000000000"], "--samples must be between"),
        ("samples-zero", ["--samples", "0"], "--samples must be between"),
        ("topk-zero", ["--topk", "0"], "--topk must be at least 1"),
        ("seed-negative", ["--seed=-1"], "--seed must be"),
        ("atol-negative", ["--atol=-1"], "atol"),
        ("atol-nan", ["--atol", "nan"], "atol"),
        ("min-cosine-2", ["--min-cosine", "2"], "min_cosine"),
        ("json-is-dir", ["--json", "{tmp}"], "is a directory"),
        ("json-folder-is-a-file", ["--json", "{tmp}/afile/r.json"], "is a file, not a folder"),
        ("report-is-dir", ["--report", "{tmp}"], "is a directory"),
        ("shape-syntax", ["--shape", "x=1xx3"], "bad --shape"),
        ("input-range-inf", ["--input-range", "x=-inf:inf"], "finite"),
        ("ort-config-no-equals", ["--ort-config", "nokey"], "expected KEY=VALUE"),
        ("disable-unknown", ["--disable", "NoSuchFusion"], "does not know this optimizer"),
        ("range-syntax", ["--range", "nonsense"], "bad --range"),
        ("preset-unknown", ["--preset", "fp7"], "preset"),
        ("level-bogus", ["--level", "max"], "invalid choice"),
    ]],
    Case("option-bundle-is-dir", [*BISECT, "--bundle", "{tmp}/adir"], 2, "is a directory", json_target_dir,
         untouched_session),
    Case("option-max-builds-zero", [*BISECT, "--max-builds", "0"], 2, "--max-builds must be", None,
         untouched_session),
    Case("option-max-culprits-zero", [*BISECT, "--max-culprits", "0"], 2, "--max-culprits must be", None,
         untouched_session),
    Case("session-is-file", FAST, 2, "is a file, not a directory", session_is_file),
    # --- edited session directories
    Case("session-json-invalid", FAST, 2, "is not valid JSON",
         chain(copy_session("check"), write_file("session.json", "{oops"))),
    Case("session-json-list", FAST, 2, "damaged .*JSON object",
         chain(copy_session("check"), write_file("session.json", "[1, 2, 3]"))),
    Case("session-json-steps-wrong-type", FAST, 2, "'steps' should be dict",
         chain(copy_session("check"), edit_json("session.json", lambda m, c: {**m, "steps": ["x"]}))),
    Case("session-json-sha-wrong-type", FAST, 2, "'model_sha256' should be str",
         chain(copy_session("check"), edit_json("session.json", lambda m, c: {**m, "model_sha256": 12}))),
    Case("session-of-other-model", FAST, 2, "another model",
         chain(copy_session("check"), use_model(m_scalar))),
    Case("session-json-symlink", FAST, 2, "symbolic link",
         chain(copy_session("check"), symlink_out("session.json"))),
    Case("steps-jsonl-symlink", BISECT, 2, "symbolic link",
         chain(copy_session("bisect"), symlink_out("bisect/steps.jsonl"))),
    Case("bisect-dir-symlink", BISECT, 2, "symbolic link",
         chain(copy_session("bisect"), symlink_out("bisect", "adir"),
               lambda ctx: (ctx.outside / "adir").mkdir())),
    Case("baseline-dir-symlink", FAST, 2, "symbolic link",
         chain(copy_session("check"), symlink_out("baseline", "adir"),
               lambda ctx: (ctx.outside / "adir").mkdir())),
    Case("manifest-dotdot-path", [*FAST, "--json", "{tmp}/r.json"], 0, None,
         chain(copy_session("check"), edit_json("baseline/manifest.json", manifest_escape(
             lambda ctx: "../../outside/secret.npy")))),
    Case("manifest-absolute-path", FAST, 0, None,
         chain(copy_session("check"), edit_json("baseline/manifest.json", manifest_escape(
             lambda ctx: str(ctx.outside / "secret.npy"))))),
    Case("manifest-etc-passwd", FAST, 0, None,
         chain(copy_session("check"), edit_json("baseline/manifest.json", manifest_escape(
             lambda ctx: "/etc/passwd")))),
    Case("manifest-wrong-types", FAST, 0, None,
         chain(copy_session("check"), edit_json("baseline/manifest.json",
                                                lambda m, c: {**m, "tensors": [{"file": 3}, "x", None]}))),
    Case("tensor-rewritten-same-size", FAST, 0, None, chain(copy_session("check"), tamper_tensor_same_size),
         recomputed_said),
    Case("tensor-replaced-by-symlink", FAST, 0, None, chain(copy_session("check"), tensor_to_symlink),
         recomputed_said),
    Case("check-json-optimized-outside", [*BISECT, "--json", "{tmp}/r.json"], 1, None,
         chain(copy_session("bisect"), edit_json("check.json",
                                                 lambda m, c: {**m, "optimized_model": "/etc/passwd"})),
         same_bisect_as_clean),
    Case("steps-edited-without-digest", [*BISECT, "--json", "{tmp}/r.json"], 1, None,
         chain(copy_session("bisect"), flip_steps), steps_recomputed),
    Case("steps-garbage-lines", [*BISECT, "--json", "{tmp}/r.json"], 1, None,
         chain(copy_session("bisect"), garbage_steps), same_bisect_as_clean),
    Case("session-inputs-pickled", FAST, 0, None, chain(copy_session("check"), pickled_session_inputs)),
    Case("stale-temp-files", FAST, 0, None, chain(copy_session("check"), stale_temps), temps_swept),
    Case("internal-error-logged", FAST, 70, r"internal error \(KeyError.*not a verdict.*traceback in .*log/crash-",
         chain(copy_session("check"), edit_json("check.json", lambda m, c: {
             k: v for k, v in m.items() if k != "passed"})), crash_log_in_session),
    Case("resume-not-found", ["resume", "{tmp}/none", "--headless", "-q"], 2, "session directory not found"),
    Case("resume-a-file", ["resume", "{model}", "--headless", "-q"], 2, "is a file"),
    Case("resume-options-wrong-type", ["resume", "{sess}", "--headless", "-q"], 2,
         "options bisect-tui cannot read|invalid options",
         chain(copy_session("check"), edit_json("session.json", lambda m, c: {
             **m, "options": {**m["options"], "samples": "many"}}))),
    Case("resume-options-bad-level", ["resume", "{sess}", "--headless", "-q"], 2, "invalid options .*level",
         chain(copy_session("check"), edit_json("session.json", lambda m, c: {
             **m, "options": {**m["options"], "config": {**m["options"]["config"], "level": "../../x"}}}))),
    Case("recent-state-garbage", FAST, 0, None, recent_state("{not json"), recent_list_safe),
    Case("recent-state-wrong-types", FAST, 0, None,
         recent_state('[1, "x", {"session": 5}, {"session": null}, {"model": []}]'), recent_list_safe),
]


def test_the_table_is_big_enough():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile(case: Case, world, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("do not touch")
    np.save(outside / "secret.npy", np.arange(4, dtype=np.float32))
    ctx = Ctx(tmp=tmp_path, model=world["model"], sess=tmp_path / "sess", outside=outside, world=world)
    if case.setup:
        case.setup(ctx)
    before_out = tree_digest(outside)
    before_in = {k: v for k, v in tree_digest(ctx.sess).items() if not _transient(k)} if ctx.sess.is_dir() else {}
    capsys.readouterr()

    try:
        code = main(ctx.fmt(case.argv))
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out, err = capsys.readouterr()

    assert code == case.code, f"exit {code}, expected {case.code}\nstdout: {out[-2000:]}\nstderr: {err}"
    assert "Traceback" not in out + err
    if case.msg is not None:
        line = one_line(err)
        assert line.startswith("bisect-tui: ") and re.search(case.msg, line), line
    elif case.code in (0, 1, 3, 4):
        assert err.strip() == "", err
    assert tree_digest(outside) == before_out, "something outside the session changed"
    assert not (outside / "CANARY").exists()
    if ctx.sess.is_dir():
        after = tree_digest(ctx.sess)
        lost = [k for k in before_in if k not in after]
        assert not lost, f"lost inside the session: {lost}"
    if case.check:
        case.check(ctx, out, err)


# --------------------------------------------------------------------------- own processes


def _cli(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "bisect_tui", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _limit_file_size(nbytes):
    def pre():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return pre


def _env(world):
    return {**os.environ, "XDG_STATE_HOME": str(world["root"] / "state-sub")}


def m_tile():
    """x[8,32] -> Tile x16 -> Relu -> ReduceSum: 16 KB intermediates from a 1 KB input, no weights."""
    reps = init("reps", np.array([1, 16], dtype=np.int64))
    axes = init("axes", np.array([1], dtype=np.int64))
    return make_model([H.make_node("Tile", ["x", "reps"], ["t"], name="tile"),
                       H.make_node("Relu", ["t"], ["r"], name="relu"),
                       H.make_node("ReduceSum", ["r", "axes"], ["y"], name="sum", keepdims=1)],
                      [vi("x", [8, 32])], [vi("y", [8, 1])], [reps, axes])


@pytest.mark.parametrize("point", ["during-baseline", "while-onnxruntime-saves", "writing-the-report"])
def test_file_size_limit_is_an_environment_fault(world, tmp_path, point):
    """RLIMIT_FSIZE makes writes fail with EFBIG (the stand-in for a full disk
    that works without privileges): exit 5, one line, nothing a rerun trusts,
    and the rerun without the limit gives the clean answer."""
    sess = tmp_path / "sess"
    if point == "during-baseline":  # 16 KB tensors over an 8 KB limit
        model = tmp_path / "tile.onnx"
        onnx.save(m_tile(), model)
        args, limit, expect = ["check", model], 8000, 0
    elif point == "while-onnxruntime-saves":
        # the baseline is done; ORT's optimized graph (~7 KB) is over the limit. A build
        # that fails only because it cannot save must not read as "this fusion breaks
        # the build" (a culprit): it is the machine's fault.
        shutil.copytree(world["check"], sess)
        shutil.rmtree(sess / "engines")
        (sess / "check.json").unlink()
        model = world["model"]
        args, limit, expect = ["bisect", model, *GELU], 6000, 1
    else:  # everything fits but the report's 20 KB plot
        model = world["model"]
        args, limit, expect = ["bisect", model, *GELU, "--report", tmp_path / "r.md"], 17000, 1
    p = _cli([*args, "--session", sess, "-q", "--no-determinism"], preexec_fn=_limit_file_size(limit),
             env=_env(world))
    out, err = p.communicate(timeout=120)
    assert p.returncode == int(ExitCode.ENVIRONMENT), out + err
    line = one_line(err)
    assert re.search("file grew past the allowed size|a file-size limit", line) and "Traceback" not in err
    leftovers = [q for q in sess.rglob("*") if _transient(q.relative_to(sess).as_posix()) and q.is_file()]
    assert not leftovers, leftovers
    p = _cli([*args, "--session", sess, "-q", "--no-determinism"], env=_env(world))
    out, err = p.communicate(timeout=120)
    assert p.returncode == expect and "Traceback" not in err, out + err


def _can_mount_tmpfs(path: Path) -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {path}"],
                       capture_output=True)
    return r.returncode == 0


def test_full_disk_is_an_environment_fault(world, tmp_path):
    """A real ENOSPC: the session on a 256 KB tmpfs (needs root and unshare)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if not _can_mount_tmpfs(mnt):
        pytest.skip("mounting a small tmpfs needs root and unshare")
    model = tmp_path / "tile.onnx"
    onnx.save(m_tile(), model)
    cmd = (f"mount -t tmpfs -o size=256k tmpfs {mnt} && "
           f"{sys.executable} -m bisect_tui check {model} --session {mnt}/sess -q --no-determinism "
           f"--samples 32; echo rc=$?")
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, env=_env(world),
                       timeout=120)
    assert "rc=5" in r.stdout, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert "the disk is full" in line and "Traceback" not in r.stderr


def test_unwritable_folder_is_an_environment_fault(world, tmp_path):
    """EACCES (chmod, as a normal user) or EROFS (a read-only bind mount, as root)
    on the session's engines folder: exit 5 and one line, the session intact."""
    sess = tmp_path / "sess"
    shutil.copytree(world["check"], sess)
    (sess / "check.json").unlink()
    shutil.rmtree(sess / "engines")
    (sess / "engines").mkdir()
    args = f"-m bisect_tui check {world['model']} --session {sess} -q --no-determinism"
    if os.geteuid() != 0:
        os.chmod(sess / "engines", 0o555)
        try:
            r = subprocess.run([sys.executable, *args.split()], capture_output=True, text=True, env=_env(world))
        finally:
            os.chmod(sess / "engines", 0o755)
    else:
        if not shutil.which("unshare"):
            pytest.skip("needs unshare as root")
        e = sess / "engines"
        cmd = f"mount --bind {e} {e} && mount -o remount,ro,bind {e} && {sys.executable} {args}; echo rc=$?"
        r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, env=_env(world))
        if "rc=" not in r.stdout:
            pytest.skip("read-only bind mounts are not available here")
        r = subprocess.CompletedProcess(r.args, int(r.stdout.rsplit("rc=", 1)[1]), r.stdout, r.stderr)
    assert r.returncode == int(ExitCode.ENVIRONMENT), r.stdout + r.stderr
    assert re.search("read-only|permission denied", one_line(r.stderr)) and "Traceback" not in r.stderr
    assert (sess / "baseline" / "manifest.json").exists() and (sess / "session.json").exists()


# Interruption points: a file that appears at that point of the run.
POINTS = {
    "prepare": lambda s: (s / "session.json").exists(),
    "after-baseline": lambda s: (s / "baseline" / "manifest.json").exists(),
    "after-check": lambda s: (s / "check.json").exists(),
    "mid-bisect": lambda s: _lines(s / "bisect" / "steps.jsonl") >= 4,
    "late-bisect": lambda s: _lines(s / "bisect" / "steps.jsonl") >= 9,
}


def _lines(p: Path) -> int:
    try:
        return p.read_bytes().count(b"\n")
    except OSError:
        return 0


@pytest.fixture(scope="module")
def two_culprits_clean(samples, tmp_path_factory, world):
    d = tmp_path_factory.mktemp("clean2")
    p = _cli(["bisect", samples / "two_culprits.onnx", "--session", d / "s", *GELU, "-q", "--json", d / "r.json"],
             env=_env(world))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 1, out + err
    return json.loads((d / "r.json").read_text())


def _summary(r: dict) -> dict:
    b = r["bisect"]
    return {"verdict": b["verdict"], "culprits": [c["original_nodes"] for c in b["culprits"]],
            "workaround": b["workaround"]["disabled_optimizers"], "level": b["level"],
            "outputs": {k: v["metrics"]["max_abs"] for k, v in r["outputs"].items()}}


@pytest.mark.slow
@pytest.mark.parametrize("sig,point", [
    (signal.SIGINT, "after-baseline"), (signal.SIGINT, "after-check"), (signal.SIGINT, "mid-bisect"),
    (signal.SIGKILL, "prepare"), (signal.SIGKILL, "after-baseline"), (signal.SIGKILL, "mid-bisect"),
    (signal.SIGKILL, "late-bisect"), (signal.SIGTERM, "mid-bisect"),
], ids=lambda v: v.name if isinstance(v, signal.Signals) else v)
def test_interrupted_bisect_resumes_to_the_identical_result(samples, two_culprits_clean, world, tmp_path,
                                                             sig, point):
    sess = tmp_path / "sess"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("x")
    before = tree_digest(outside)
    args = ["bisect", samples / "two_culprits.onnx", "--session", sess, *GELU, "-q", "--json", tmp_path / "r.json"]
    p = _cli(args, env=_env(world))
    deadline = time.monotonic() + 120
    while not POINTS[point](sess) and p.poll() is None and time.monotonic() < deadline:
        try:  # waits on the run itself between looks at the session: ends the moment it does
            p.wait(timeout=0.001)
        except subprocess.TimeoutExpired:
            pass
    assert p.poll() is None, f"the run finished before reaching {point}; the interruption was not tested"
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    if sig == signal.SIGKILL:
        assert p.returncode == -signal.SIGKILL
    else:
        assert p.returncode == int(ExitCode.CANCELLED), out + err
        assert "interrupted; rerun the same command to resume" in err and "Traceback" not in err
        assert not list((sess / "tmp").glob("*")) if (sess / "tmp").exists() else True
    inside = {k for k in tree_digest(sess) if not _transient(k)}
    # the rerun of the same command resumes and gives the identical answer
    p2 = _cli(args, env=_env(world))
    out2, err2 = p2.communicate(timeout=300)
    assert p2.returncode == 1, out2 + err2
    assert "Traceback" not in err2
    assert _summary(json.loads((tmp_path / "r.json").read_text())) == _summary(two_culprits_clean)
    after = tree_digest(sess)
    assert not [k for k in inside if k not in after]  # nothing recorded before the signal was lost
    assert not [k for k in after if _transient(k) and not k.endswith("/")]  # no temp files left
    assert tree_digest(outside) == before


def test_determinism_second_run_is_a_fresh_process(world, tmp_path, capsys):
    """The unseeded RandomNormal gives identical values twice in one process;
    only a second process shows it is not deterministic (exit 3, not a fake
    fusion failure later)."""
    model = tmp_path / "rnd.onnx"
    onnx.save(m_random(), model)
    code = main(["check", str(model), "--session", str(tmp_path / "s"), "-q", "--json", str(tmp_path / "r.json")])
    out, _ = capsys.readouterr()
    assert code == 3
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["verdict"] == "nondeterministic"
    assert r["determinism"]["first"]["op_type"] == "RandomNormalLike"
    assert "STOP: the baseline is not deterministic (exit 3)" in out
    # the engine was judged while the second run finished (run_all): not reported
    assert r["determinism"]["overlapped"] and r["engine"] is None and r["outputs"] == {}
    assert "fused engine:" not in out and r["arbiter"] is None


def test_sweep_removes_cut_atomic_writes_in_every_session_folder(tmp_path):
    """A SIGKILL can cut an atomic write in any folder of the session (a culprit's
    subgraph, an engine folder): the next run's sweep removes those half-written
    temp files everywhere, follows no link, and leaves real files alone."""
    from bisect_tui.core.safepath import sweep_temp

    sess = tmp_path / "sess"
    cut = [sess / "bisect" / "culprit_2" / ".subgraph.onnx.csl3tgww.tmp",
           sess / "engines" / "ort-abc" / ".fused_nodes.json.x1.tmp",
           sess / "baseline" / ".tmp_k2j.npy", sess / ".session.json.q.tmp", sess / "tmp" / "ort_build" / "m.onnx"]
    kept = [sess / "bisect" / "culprit_2" / "subgraph.onnx", sess / "baseline" / "a.npy", sess / "session.json"]
    for f in cut + kept:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / ".keep.me.tmp").write_text("not the session's")
    (sess / "bisect" / "linked").symlink_to(outside, target_is_directory=True)
    assert sweep_temp(sess) == 5
    assert not [f for f in cut if f.exists()] and all(f.exists() for f in kept)
    assert (outside / ".keep.me.tmp").exists()
