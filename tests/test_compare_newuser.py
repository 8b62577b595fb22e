"""compare as a new user met it (issue 22): no top-1/top-5 ranking for box regression
or a detection head (only class scores rank), the golden path as the user can use it
(relative, never this machine's absolute path), plots in `<report>-plots/` like check's."""

from __future__ import annotations

import numpy as np
from markdown_it import MarkdownIt

from bisect_tui.cli import main
from bisect_tui.core.compare.pitfalls import ranking_applies


def values_lines(out: str) -> dict[str, str]:
    """Each tensor's values line in the terminal text, by test tensor name."""
    found, name = {}, None
    for line in out.splitlines():
        if line.startswith(("  [PASS] ", "  [FAIL] ")):
            name = line[9:].split(" vs golden ")[0]
        elif name and line.strip().startswith("max_abs "):
            found[name] = line
            name = None
    return found


def run(argv, capsys):
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().out


def test_ranking_only_for_class_scores(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(3)
    golden = {
        "boxes": rng.uniform(0, 640, (1, 8400, 4)).astype(np.float32),  # YOLO x, y, w, h
        "output0": rng.uniform(0, 640, (1, 84, 8400)).astype(np.float32),  # a YOLOv8 head: boxes + scores
        "logits": rng.standard_normal((2, 20)).astype(np.float32),
    }
    np.savez("golden.npz", **golden)
    np.savez("test.npz", **{k: v + np.float32(0.01) for k, v in golden.items()})
    code, out = run(["compare", tmp_path / "golden.npz", tmp_path / "test.npz", "--report", "r.md"], capsys)
    assert code == 1
    lines = values_lines(out)
    assert "ranking:" not in lines["boxes"] and "ranking:" not in lines["output0"]
    assert "ranking: top-1 100.0%" in lines["logits"]
    # the report's table: top-1 only where it means something
    tokens = MarkdownIt("commonmark").enable("table").parse((tmp_path / "r.md").read_text())
    rows = {}
    cells = [t for t in tokens if t.type == "inline"]
    for i, t in enumerate(cells):
        if t.content in golden and cells[i - 1].content in ("PASS", "FAIL") and t.content not in rows:
            rows[t.content] = [c.content for c in cells[i - 1:i + 9]]
    assert rows["boxes"][8] == "-" and rows["output0"][8] == "-" and rows["logits"][8] == "100.0%"
    # asked for (--topk 3): the user says the detection head is a ranking
    code, out = run(["compare", "golden.npz", "test.npz", "--topk", "3"], capsys)
    assert all("ranking: top-1" in line for line in values_lines(out).values())


def test_rules_of_ranking_applies():
    assert not ranking_applies("output0", (1, 8400, 4))
    assert not ranking_applies("bbox_pred", (1, 100, 16))  # a box name, whatever its last axis
    assert not ranking_applies("output0", (1, 84, 8400))  # rank 3 without a score name
    assert ranking_applies("cls_scores", (1, 8400, 80))
    assert ranking_applies("output", (1, 1000))  # a classifier's vector
    assert not ranking_applies("local_loss", (4,))


def test_paths_as_the_user_can_use_them_and_plots_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    g = np.random.default_rng(5).standard_normal((3, 40)).astype(np.float32)
    np.savez("data/golden.npz", x=g)
    np.savez("data/test.npz", x=g + 0.5)
    code, out = run(["compare", tmp_path / "data" / "golden.npz", tmp_path / "data" / "test.npz",
                     "--report", tmp_path / "out" / "report.md"], capsys)
    assert code == 1
    assert "golden: data/golden.npz (" in out and "test:   data/test.npz (" in out
    assert str(tmp_path) not in out
    md = (tmp_path / "out" / "report.md").read_text()
    assert str(tmp_path) not in md and "- golden: `golden.npz`" in md
    assert list((tmp_path / "out" / "report-plots").glob("*.png")) and not (tmp_path / "out" / "report_plots").exists()
    assert "](report-plots/x.png)" in md
