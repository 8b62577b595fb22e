"""Sessions keyed by model and inputs, and `bisect-tui sessions` (list, size, prune)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from bisect_tui.cli import main
from bisect_tui.core import sessions_admin as sa

from newuser_models import rows_by_input, vad_like

VAD = ["--shape", "batch=1", "--input-value", "sr=16000", "--input-value", "flag=true"]


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_each_input_choice_gets_its_own_default_directory(tmp_path, monkeypatch, capsys, samples):
    monkeypatch.chdir(tmp_path)
    model = vad_like(tmp_path / "vad.onnx")
    code, _, err = run(["check", model, *VAD, "--shape", "sequence=8", "-q"], capsys)
    assert code == 0, err
    code, _, err = run(["check", model, *VAD, "--shape", "sequence=16", "-q"], capsys)
    assert code == 0, err  # another shape: no "made with other inputs" lock
    dirs = sorted(p.name for p in (tmp_path / "bisect-sessions").iterdir())
    assert len(dirs) == 2 and all(re.fullmatch(r"vad-[0-9a-f]{8}-[0-9a-f]{6}", d) for d in dirs), dirs
    # the defaults keep the plain <model>-<hash> name (documented paths stay valid)
    code, _, _ = run(["check", samples / "transformer_block.onnx", "-q"], capsys)
    assert any(re.fullmatch(r"transformer_block-[0-9a-f]{8}", p.name)
               for p in (tmp_path / "bisect-sessions").iterdir())


def test_a_named_directory_still_refuses_other_inputs(tmp_path, capsys):
    model = vad_like(tmp_path / "vad.onnx")
    sess = tmp_path / "mine"
    assert run(["check", model, *VAD, "--shape", "sequence=8", "--session", sess, "-q"], capsys)[0] == 0
    code, _, err = run(["check", model, *VAD, "--shape", "sequence=16", "--session", sess, "-q"], capsys)
    assert code == 2 and "was made with other inputs" in err and "choose another --session" in err


def test_sessions_list_sizes_and_prune_only_failed_attempts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    good = vad_like(tmp_path / "vad.onnx")
    assert run(["check", good, *VAD, "--shape", "sequence=8", "-q"], capsys)[0] == 0
    bad = rows_by_input(tmp_path / "rows.onnx")
    assert run(["check", bad, "-q"], capsys)[0] == 2  # random row indices: a failed attempt
    base = tmp_path / "bisect-sessions"
    # a link to a session and a folder that is not one are never listed nor removed
    other = tmp_path / "keep-me"
    other.mkdir()
    (other / "data.txt").write_text("mine")
    os.symlink(other, base / "link-to-elsewhere")
    entries = sa.find_sessions(base, include_recent=False)
    assert sorted(e.model for e in entries) == ["rows.onnx", "vad.onnx"]
    vad = next(e for e in entries if e.model == "vad.onnx")
    assert vad.finished and vad.bytes == sa.dir_size(vad.path) > 10_000  # the baseline dump is in it
    assert "sequence=8" in vad.inputs and "sr=16000" in vad.inputs

    code, out, _ = run(["sessions", "--dir", base], capsys)
    assert code == 0 and "2 session(s)" in out and "vad.onnx" in out and "check: pass" in out
    code, _, err = run(["sessions", "prune", "--dir", base], capsys)
    assert code == 2 and "--unfinished" in err  # nothing is removed without saying which
    code, out, _ = run(["sessions", "prune", "--unfinished", "--dry-run", "--dir", base], capsys)
    assert code == 0 and "would remove" in out and "rows" in out and len(list(base.iterdir())) == 3
    code, out, _ = run(["sessions", "prune", "--unfinished", "--dir", base], capsys)
    assert code == 0 and "1 session(s) removed" in out
    left = sorted(p.name for p in base.iterdir())
    assert len(left) == 2 and any(n.startswith("vad-") for n in left) and "link-to-elsewhere" in left
    assert (other / "data.txt").read_text() == "mine"
    # a session elsewhere (in the app's recent list) is listed, but pruned only when asked
    elsewhere = tmp_path / "elsewhere"
    assert run(["check", good, *VAD, "--shape", "sequence=4", "--session", elsewhere, "-q"], capsys)[0] == 0
    code, out, _ = run(["sessions", "--dir", base], capsys)
    assert "elsewhere" in out
    code, out, _ = run(["sessions", "prune", "--all", "--dir", base], capsys)
    assert code == 0 and not any(p.name.startswith("vad-") for p in base.iterdir())
    assert (other / "data.txt").exists() and (elsewhere / "session.json").exists()
    code, out, _ = run(["sessions", "prune", "--all", "--include-recent", "--dir", base], capsys)
    assert code == 0 and not elsewhere.exists()


def test_is_session_refuses_links_and_foreign_json(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "session.json").write_text('{"tool": "something-else"}')
    assert not sa.is_session(d)
    (d / "session.json").write_text('{"tool": "bisect-tui"}')
    assert sa.is_session(d)
    link = tmp_path / "l"
    link.symlink_to(d)
    assert not sa.is_session(link) and not sa.is_session(Path(tmp_path / "missing"))
