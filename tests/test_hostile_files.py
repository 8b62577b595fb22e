"""Files a careless or hostile user hands to `compare` and to our outputs: each
is refused with exit 2 and one line, quickly, in little memory, touching nothing
outside. Every case runs the real command in a fresh process, measured."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bisect_tui.core import atomic, outputs
from bisect_tui.core.bounded import json_depth, parse_yaml
from bisect_tui.core.compare.globs import captures
from bisect_tui.core.errors import UserError

from testlib import REPO

# The measuring parent: runs the command as a child subreaper (every process the
# command leaves behind is re-parented to it, not to init), then prints the exit
# code, wall time, peak RSS and how many of the command's processes outlived it.
_WRAP = (
    "import ctypes, json, os, resource, subprocess, sys, time\n"
    "ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER\n"
    "t = time.monotonic()\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "s = time.monotonic() - t\n"
    "me = str(os.getpid())\n"
    "left = []\n"
    "for d in os.listdir('/proc'):\n"
    "    try:\n"
    "        st = open(f'/proc/{d}/stat').read().rsplit(')', 1)[1].split()\n"
    "    except (OSError, IndexError):\n"
    "        continue\n"
    "    if st[1] == me and st[0] != 'Z':\n"
    "        left.append(open(f'/proc/{d}/cmdline').read().replace('\\0', ' ')[:120])\n"
    "print(json.dumps({'rc': p.returncode, 's': s, 'left': left,\n"
    "                  'rss_mb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,\n"
    "                  'out': p.stdout, 'err': p.stderr}))\n"
)


def cli(*args, cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", _WRAP, sys.executable, "-m", "bisect_tui", *map(str, args)],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    return json.loads(p.stdout)


def refused(r: dict, *needles: str) -> str:
    """Exit 2, one line, no traceback, under 5 s and 500 MB, no process left."""
    assert r["rc"] == 2, r
    assert not r["left"], f"processes outlived the command: {r['left']}"
    assert "Traceback" not in r["err"], r["err"]
    lines = r["err"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bisect-tui: error: "), r["err"]
    assert len(lines[0]) < 600, f"the error line quotes too much: {len(lines[0])} characters"
    assert r["s"] < 5, f"took {r['s']:.1f} s"
    assert r["rss_mb"] < 500, f"peak RSS {r['rss_mb']:.0f} MB"
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _forged_npy_bytes(shape: tuple[int, ...]) -> bytes:
    """A .npy header claiming `shape` float32, followed by 16 bytes of data."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue() + b"\0" * 16


@pytest.fixture
def golden(tmp_path) -> Path:
    np.savez(tmp_path / "golden.npz", out=np.ones((2, 3), np.float32))
    return tmp_path / "golden.npz"


def test_npz_member_claiming_37_gib_is_refused(tmp_path, golden):
    with zipfile.ZipFile(tmp_path / "test.npz", "w") as z:
        z.writestr("out.npy", _forged_npy_bytes((100_000, 100_000)))
    line = refused(cli("compare", golden, tmp_path / "test.npz", cwd=tmp_path), "37.3 GiB", "only 16 bytes")
    assert "forged" in line
    # the same header as a plain .npy: refused the same way
    (tmp_path / "t.npy").write_bytes(_forged_npy_bytes((100_000, 100_000)))
    refused(cli("compare", golden, tmp_path / "t.npy", cwd=tmp_path), "37.3 GiB")


def test_npz_zip_bomb_is_refused_unread(tmp_path, golden):
    zeros = np.zeros((96 << 20) // 4, np.float32)  # 96 MiB of zeros deflate about 1,000 times
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("out.npy", "w") as fh:
            np.lib.format.write_array(fh, zeros)
    assert (tmp_path / "bomb.npz").stat().st_size < 1 << 20
    refused(cli("compare", golden, tmp_path / "bomb.npz", cwd=tmp_path), "zip bomb", "np.savez")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_deeply_nested_maps_are_refused(tmp_path, golden, suffix):
    np.savez(tmp_path / "test.npz", out=np.ones((2, 3), np.float32))
    deep = 100_000
    text = "[" * deep + "]" * deep
    (tmp_path / f"m{suffix}").write_text(text)
    refused(cli("compare", golden, tmp_path / "test.npz", "--map", tmp_path / f"m{suffix}", cwd=tmp_path),
            "deep")


def test_yaml_alias_bomb_is_refused_and_not_echoed(tmp_path, golden):
    np.savez(tmp_path / "test.npz", out=np.ones((2, 3), np.float32))
    lines = ['a0: &a0 ["xxxxxxxxxx", "xxxxxxxxxx", "xxxxxxxxxx", "xxxxxxxxxx", "xxxxxxxxxx"]']
    for i in range(1, 12):
        lines.append(f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}]")
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    refused(cli("compare", golden, tmp_path / "test.npz", "--map", tmp_path / "bomb.yaml", cwd=tmp_path),
            "aliases")


def test_huge_map_is_refused_before_reading(tmp_path, golden):
    np.savez(tmp_path / "test.npz", out=np.ones((2, 3), np.float32))
    rule = json.dumps({f"name_{i}": f"golden_{i}" for i in range(20_000)})
    with open(tmp_path / "big.json", "w") as fh:  # ~50 MB
        fh.write("{" + ",".join([rule[1:-1]] * 90) + "}")
    assert (tmp_path / "big.json").stat().st_size > 40 << 20
    refused(cli("compare", golden, tmp_path / "test.npz", "--map", tmp_path / "big.json", cwd=tmp_path),
            "MiB accepted")


def test_many_stars_do_not_backtrack(tmp_path):
    name = "a" * 59 + "b"
    pattern = "*a" * 25 + "*c"
    t = time.monotonic()
    assert captures(pattern, name) is None
    assert time.monotonic() - t < 1
    # the regex it replaces: '(.*)a' * 25 + '(.*)c' backtracks for ever on this name
    # the same answers as that regex where it finishes: the longest text for each star, left first
    assert captures("dec_*_*", "dec_a_b_c") == ("a_b", "c")
    assert captures("x?[0-9]*", "xy7tail") == ("y", "7", "tail")
    assert captures("[!a]b", "ab") is None and captures("[!a]b", "cb") == ("c",)
    assert captures("**", "") == ("",)
    # end to end: the mapping file with that rule, a 60-character test name
    np.savez(tmp_path / "golden.npz", **{"g": np.ones(3, np.float32)})
    np.savez(tmp_path / "test.npz", **{name: np.ones(3, np.float32)})
    (tmp_path / "m.json").write_text(json.dumps({pattern: "g"}))
    r = cli("compare", tmp_path / "golden.npz", tmp_path / "test.npz", "--map", tmp_path / "m.json",
            cwd=tmp_path)
    assert r["rc"] == 2 and r["s"] < 5, r


def test_a_literal_map_name_that_matches_nothing_stops_with_did_you_mean(tmp_path):
    np.savez(tmp_path / "golden.npz", logits=np.ones(3, np.float32))
    np.savez(tmp_path / "test.npz", output_0=np.ones(3, np.float32))
    (tmp_path / "m.json").write_text(json.dumps({"output_O": "logits"}))
    refused(cli("compare", tmp_path / "golden.npz", tmp_path / "test.npz", "--map", tmp_path / "m.json",
                cwd=tmp_path), "'output_O'", "did you mean 'output_0'")


def test_json_depth_counts_outside_strings_only():
    assert json_depth('{"a": "[[[[", "b": [1, {"c": 2}]}') == 3
    assert json_depth("[]") == 1 and json_depth("") == 0


def test_yaml_limits_hold_for_ordinary_files():
    assert parse_yaml("a: b\nc: {golden: d, dtype: fp16}\n", "map") == {"a": "b", "c": {"golden": "d", "dtype": "fp16"}}
    with pytest.raises(UserError, match="nested more than 3"):
        parse_yaml("a: {b: {c: {d: 1}}}", "map", max_depth=3)


# --------------------------------------------------------------------------- outputs


def test_outputs_never_replace_special_or_foreign_files(tmp_path):
    with pytest.raises(UserError, match="device, pipe or socket"):
        outputs.check_target(Path("/dev/full"), "--json", "json")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UserError, match="device, pipe or socket"):
        outputs.check_target(tmp_path / "fifo", "--report", "report")
    with pytest.raises(UserError, match="is a directory"):
        outputs.check_target(tmp_path, "--report", "report")
    (tmp_path / "notes.zip").write_bytes(b"my own notes, not a zip")
    with pytest.raises(UserError, match="not a bisect-tui bundle"):
        outputs.check_target(tmp_path / "notes.zip", "--bundle", "bundle")
    (tmp_path / "notes.md").write_text("# My notes\n")
    with pytest.raises(UserError, match="not a bisect-tui report"):
        outputs.check_target(tmp_path / "notes.md", "--report", "report")
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UserError, match="symbolic link"):
        outputs.check_target(tmp_path / "link.json", "--json", "json")
    # ours, or new: accepted
    (tmp_path / "r.md").write_text("# bisect-tui check: PASS\n")
    outputs.check_target(tmp_path / "r.md", "--report", "report")
    (tmp_path / "r.json").write_text('{\n  "verdict": "pass",\n  "exit_code": 0\n}\n')
    outputs.check_target(tmp_path / "r.json", "--json", "json")
    with zipfile.ZipFile(tmp_path / "b.zip", "w") as z:
        z.writestr("REPORT.md", "# bisect-tui bisect\n")
    outputs.check_target(tmp_path / "b.zip", "--bundle", "bundle")
    outputs.check_target(tmp_path / "new" / "deeper" / "r.json", "--json", "json")
    assert (tmp_path / "notes.md").read_text() == "# My notes\n"


def test_atomic_writes_refuse_devices_and_honour_the_umask(tmp_path):
    with pytest.raises(UserError, match="not a regular file"):
        atomic.write_json(Path("/dev/full"), {"a": 1})
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # still the device
    atomic.write_text(tmp_path / "r.md", "x")
    assert stat.S_IMODE(os.stat(tmp_path / "r.md").st_mode) == 0o666 & ~outputs.user_umask()


def test_compare_json_to_a_device_is_refused_before_work(tmp_path, golden):
    np.savez(tmp_path / "test.npz", out=np.ones((2, 3), np.float32))
    refused(cli("compare", golden, tmp_path / "test.npz", "--json", "/dev/full", cwd=tmp_path), "/dev/full")
    (tmp_path / "mine.md").write_text("my notes\n")
    refused(cli("compare", golden, tmp_path / "test.npz", "--report", tmp_path / "mine.md", cwd=tmp_path),
            "not a bisect-tui report")
    assert (tmp_path / "mine.md").read_text() == "my notes\n"


def test_compare_out_of_memory_is_an_environment_fault(tmp_path):
    big = np.random.default_rng(0).standard_normal((160 << 20) // 4).astype(np.float32)
    np.save(tmp_path / "g.npy", big)
    np.save(tmp_path / "t.npy", big)
    # a cap on the address space makes the comparison's float64 copies fail to allocate
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1200 << 20, 1200 << 20)); "
            "from bisect_tui.cli import main; sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", code, "compare", "g.npy", "t.npy"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 5, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "out of memory" in p.stderr


def test_torch_factory_that_exits_is_a_usage_error(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "quits.py").write_text("import sys\n\ndef make():\n    sys.exit(0)\n")
    r = cli("check", "--torch", "quits.py:make", cwd=tmp_path)
    assert r["rc"] == 2, r
    assert "Traceback" not in r["err"] and "called sys.exit(0)" in r["err"]


# --------------------------------------------------------------------------- sessions


def _fake_session(root: Path, name: str, text: str | None = None) -> Path:
    """A session directory as `sessions` sees it: a session.json the tool wrote."""
    d = root / "bisect-sessions" / name
    d.mkdir(parents=True)
    (d / "session.json").write_text(text if text is not None else json.dumps(
        {"tool": "bisect-tui", "model_source": f"{name}.onnx", "created": "2026-12-01T00:00:00+00:00",
         "steps": {"fused": {"state": "passed"}}}))
    return d


def test_a_damaged_session_is_listed_and_skipped_never_fatal(tmp_path):
    good = _fake_session(tmp_path, "good-1")
    deep = '{"tool": "bisect-tui", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    bad = _fake_session(tmp_path, "bad-1", deep)
    r = cli("sessions", "list", cwd=tmp_path)
    assert r["rc"] == 0 and "Traceback" not in r["err"], r
    assert "good-1" in r["out"] and "bad-1" in r["out"] and "damaged" in r["out"], r["out"]
    r = cli("sessions", "prune", "--all", cwd=tmp_path)
    assert r["rc"] == 0, r
    assert not good.exists() and bad.exists()  # damaged: cannot be proven ours, kept


@pytest.mark.parametrize("age", ["nan", "-1", "inf"])
def test_prune_refuses_ages_that_are_not_a_number_of_days(tmp_path, age):
    d = _fake_session(tmp_path, "recent-1")
    refused(cli("sessions", "prune", "--older-than", age, cwd=tmp_path), "--older-than")
    assert d.exists()


# --------------------------------------------------------------------------- flags


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A small real model: x[2,8] -> MatMul -> Relu -> y (nodes mm, relu)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                           helper.make_node("Relu", ["a"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w])
    path = tmp_path_factory.mktemp("m") / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("flags, needle", [
    (["--workers", "100000"], "at most"),
    (["--fanout", "1000"], "at most 64 split points"),
    (["--keep-fp32", "mm"], "at --precision fp32 it would change nothing"),
    (["--precision", "fp16", "--keep-fp32", "rleu"], "did you mean 'relu'"),
    (["--engine", "openvino", "--ov-mark", "no_such_tensor:0"], "no tensor of that name"),
    (["--engine", "openvino", "--ov-config", "NUM_STREAMS=banana"], "rejects this value"),
])
def test_flags_that_name_nothing_or_ask_too_much_are_refused(tmp_path, model, flags, needle):
    refused(cli("bisect", model, "--session", tmp_path / "s", "-q", *flags, cwd=tmp_path), needle)


def test_many_unknown_keep_names_are_refused_with_one_line(tmp_path, model):
    names = [a for i in range(1_000) for a in ("--keep-fp32", f"node_{i}")]
    line = refused(cli("check", model, "--session", tmp_path / "s", "-q", "--precision", "fp16", *names,
                       cwd=tmp_path), "no node of that name")
    assert "999 more unknown" in line
    # 10,000 of them: refused before parsing (argparse's time grows with their square)
    names = [a for i in range(10_000) for a in ("--keep-fp32", f"node_{i}")]
    refused(cli("check", model, "--session", tmp_path / "s", "-q", "--precision", "fp16", *names,
                cwd=tmp_path), "20,007 command-line arguments")


def test_an_openvino_run_leaves_no_telemetry_child_and_no_traceback(tmp_path, model):
    r = cli("check", model, "--session", tmp_path / "s", "-q", "--engine", "openvino", cwd=tmp_path)
    assert r["rc"] == 0, r
    assert not r["left"] and "Traceback" not in r["err"], r


def test_commands_that_exit_early_leave_no_second_run_behind(tmp_path, model):
    # the determinism check's interpreter is started first thing: an early refusal must end it
    r = cli("check", model, "--session", tmp_path / "s", "-q", "--precision", "fp16", "--keep-fp32", "nope",
            cwd=tmp_path)
    refused(r, "no node of that name")
    r = cli("check", model, "--session", tmp_path / "s", "-q", cwd=tmp_path)
    assert r["rc"] == 0 and not r["left"], r
