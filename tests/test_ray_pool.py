"""The build pool on Ray actors (`bisect --ray ADDRESS`), on a local Ray instance.

Ray is an optional extra (`pip install -e '.[ray]'`) and not in the
`test` extra: the tests that need it skip without it; the ones about what
happens without it (lazy import, the message) always run."""

from __future__ import annotations

import functools

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_tui.cli import main
from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.engines.registry import get_engine

from testlib import culprit_matches, gelu_triage, search_shape

NO_RAY = "Ray is an optional extra, not installed here: pip install -e '.[ray]' to run this test"


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (starting one costs seconds)."""
    ray = pytest.importorskip("ray", reason=NO_RAY)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_actors_give_the_serial_result_and_build_count(local_ray, samples, cases, tmp_path):
    from bisect_tui.core.bisect.ray_pool import RayBuildPool

    model = samples / "two_culprits.onnx"
    serial = run_bisection(gelu_triage(model, tmp_path / "serial"), workers=1, fanout=3, use_probe=False)
    pool = RayBuildPool("local", 2, functools.partial(get_engine, "ort"))
    pool.start()  # the actors import the engine while the checklist runs
    try:
        t = gelu_triage(model, tmp_path / "ray")
        res = run_bisection(t, workers=2, fanout=3, use_probe=False, pool=pool)
        names = pool.names
    finally:
        pool.close()
    assert local_ray.is_initialized()  # a Ray this pool did not start is left running
    assert search_shape(res) == search_shape(serial)
    assert res["parallel"] == {"workers": 2, "fanout": 3, "pool": "ray"}
    expected = sorted(cases["two_culprits"]["expected_culprits"])
    found = sorted(c["original_nodes"] for c in res["culprits"])
    assert len(found) == 2 and all(culprit_matches(f, e) for f, e in zip(found, expected))
    # every build ran on one of the two actors, and the k-ary rounds used both
    assert len(names) == 2 and all(n.startswith(("ray0@", "ray1@")) for n in names)
    lines = [json.loads(x) for x in (t.session.bisect_dir / "steps.jsonl").read_text().splitlines()]
    built = [r for r in lines if not r.get("cached") and "from" not in r]
    assert {r["worker"] for r in built} <= set(names)
    assert {r["worker"] for r in built if r["kind"] == "bisect"} == set(names)
    # the optimized graphs the actors built came back into the session, where the search reads them
    unmarked = [r for r in built if r.get("optimized")]
    assert unmarked
    for r in unmarked:
        path = Path(r["optimized"])  # the session was given as an absolute path
        assert path.is_file() and path.stat().st_size > 0
        assert path.resolve().is_relative_to(t.session.root.resolve())


def test_cli_ray_local(local_ray, samples, cases, tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["bisect", str(samples / "deep_stack.onnx"), "--session", str(tmp_path / "s"),
                 "--ort-config", "optimization.enable_gelu_approximation=1", "--ray", "local",
                 "--workers", "2", "--fanout", "2", "--no-probe", "--json", str(out), "-q"])
    assert code == 1
    res = json.loads(out.read_text())["bisect"]
    assert res["parallel"] == {"workers": 2, "fanout": 2, "pool": "ray"}
    assert culprit_matches(res["culprits"][0]["original_nodes"], cases["deep_stack"]["expected_culprits"][0])
    assert {s["worker"].split("@")[0] for s in res["steps"] if not s["cached"]} <= {"ray0", "ray1"}
    capsys.readouterr()


def test_ray_is_imported_only_for_ray():
    """`--help` and the core's modules (the Ray pool's included) never import Ray."""
    code = ("import sys, contextlib, io\n"
            "import bisect_tui.core.bisect.ray_pool, bisect_tui.core.bisect.run\n"
            "from bisect_tui.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['bisect', '--help'])\n    except SystemExit:\n        pass\n"
            "print('ray' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_ray_missing_is_one_line_with_the_install_command(samples, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: `import ray` raises ImportError
    code = main(["bisect", str(samples / "deep_stack.onnx"), "--session", str(tmp_path / "s"),
                 "--ray", "local", "-q"])
    assert code == 2
    err = capsys.readouterr().err
    assert "pip install -e '.[ray]' from a clone" in err and "Traceback" not in err
