"""Parallel candidates: the same search, builds spread over worker processes.

The strategy (fanout) alone decides which builds are made; the pool only how
many run at once. So with 1 worker and with 2 the culprits, the passes, the
steps and the build count must be identical, on samples with known answers."""

from __future__ import annotations

import json

import pytest

from bisect_tui.cli import main
from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.core.bisect.search import split_points
from bisect_tui.api import EngineConfig

from testlib import culprit_matches, gelu_triage, search_shape

GELU = (("optimization.enable_gelu_approximation", "1"),)


def test_split_points_cut_the_range_evenly():
    assert split_points(0, 10, 1) == [5]  # the binary search's midpoint
    assert split_points(0, 9, 2) == [3, 6]
    assert split_points(4, 5, 3) == [4]  # one element left: one candidate
    for lo, hi, k in [(0, 100, 3), (7, 40, 2), (0, 2, 4)]:
        pts = split_points(lo, hi, k)
        assert pts == sorted(set(pts)) and all(lo <= p < hi for p in pts) and len(pts) <= k


@pytest.mark.slow
def test_two_workers_give_the_serial_result_and_build_count(samples, cases, tmp_path):
    model = samples / "two_culprits.onnx"
    # without the probe's suspects the search is all k-ary rounds
    serial = run_bisection(gelu_triage(model, tmp_path / "w1"), workers=1, fanout=3, use_probe=False)
    t2 = gelu_triage(model, tmp_path / "w2")
    parallel = run_bisection(t2, workers=2, fanout=3, use_probe=False)
    assert search_shape(serial) == search_shape(parallel)
    expected = sorted(cases["two_culprits"]["expected_culprits"])
    found = sorted(c["original_nodes"] for c in parallel["culprits"])
    assert len(found) == 2 and all(culprit_matches(f, e) for f, e in zip(found, expected))
    assert all(p == ["GeluApproximation"] for p in search_shape(parallel)["passes"])
    assert parallel["parallel"] == {"workers": 2, "fanout": 3, "pool": "processes"}
    # the step log says who built what: some builds ran in the worker process
    lines = [json.loads(x) for x in (t2.session.bisect_dir / "steps.jsonl").read_text().splitlines()]
    built = [r for r in lines if not r.get("cached") and "from" not in r]
    workers = {r["worker"] for r in built}
    assert "main" in workers and any(w.startswith("w") and w[1:].isdigit() for w in workers), workers
    rounds = [r for r in built if r["kind"] == "bisect"]
    assert rounds and all(r.get("round_size", 1) >= 2 for r in rounds[:1])  # the k-ary rounds built together
    assert any(r["worker"] != "main" for r in rounds)
    assert "probe" not in parallel
    serial_lines = [json.loads(x) for x in (tmp_path / "w1" / "bisect" / "steps.jsonl").read_text().splitlines()]
    assert {r.get("worker") for r in serial_lines if "from" not in r} == {"main"}

    # resume: a rerun of the parallel session rebuilds nothing and says the same
    again = run_bisection(gelu_triage(model, tmp_path / "w2"), workers=2, fanout=3, use_probe=False)
    assert again["engine_builds"] == 0
    assert [c["original_nodes"] for c in again["culprits"]] == search_shape(parallel)["culprits"]


def test_fanout_one_is_the_binary_search(samples, cases, tmp_path):
    """Default strategy unchanged by the pool: one worker or two, same steps."""
    model = samples / "deep_stack.onnx"
    a = run_bisection(gelu_triage(model, tmp_path / "a"), workers=1)
    b = run_bisection(gelu_triage(model, tmp_path / "b"), workers=2)
    assert search_shape(a) == search_shape(b)
    assert culprit_matches(a["culprits"][0]["original_nodes"], cases["deep_stack"]["expected_culprits"][0])
    assert not any(s.get("round_size") for s in a["steps"] if s["kind"] == "bisect")


def _cli_bisect_deep_stack(samples, tmp_path, *flags) -> dict:
    """`bisect-tui bisect` on deep_stack (Gelu approximation, no probe, fanout 2) with
    `flags`: its JSON result's bisect part, after checking the failing exit code."""
    out = tmp_path / "r.json"
    code = main(["bisect", str(samples / "deep_stack.onnx"), "--session", str(tmp_path / "s"),
                 "--ort-config", "optimization.enable_gelu_approximation=1", *flags,
                 "--fanout", "2", "--no-probe", "--json", str(out), "-q"])
    assert code == 1
    return json.loads(out.read_text())["bisect"]


def test_cli_workers_and_fanout_flags(samples, cases, tmp_path, capsys):
    res = _cli_bisect_deep_stack(samples, tmp_path, "--workers", "2")
    assert res["parallel"] == {"workers": 2, "fanout": 2, "pool": "processes"}
    assert res["verdict"] == "culprits" and len(res["culprits"]) == 1
    assert culprit_matches(res["culprits"][0]["original_nodes"], cases["deep_stack"]["expected_culprits"][0])
    assert "probe" not in res and not any(s["kind"] == "suspect alone" for s in res["steps"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["bisect", str(samples / "deep_stack.onnx"), "--workers", "0"])
    assert exc.value.code == 2
    assert "expected 1 or more" in capsys.readouterr().err


def test_pool_starts_lazily_only_for_slow_builds(samples, monkeypatch):
    """Fast builds (these take milliseconds) stay in this process: a worker would cost
    more to start than it saves. Once builds count as slow, the round is shared."""
    import numpy as np

    from bisect_tui.core.bisect import pool as poolmod
    from bisect_tui.engines.registry import get_engine

    model = samples / "deep_stack.onnx"
    feeds = [{"x": np.random.default_rng(0).standard_normal((1, 8, 32)).astype(np.float32)}]
    cfg = EngineConfig(config_entries=GELU).to_dict()
    jobs = [poolmod.BuildJob(config=cfg, marks=()), poolmod.BuildJob(config=cfg, marks=("blk0/ln/mean:0",))]
    p = poolmod.BuildPool(2, "ort")
    p.attach(get_engine("ort"), "ort", str(model), feeds)
    try:
        fast = p.run(jobs)
        assert [r.worker for r in fast] == ["main", "main"] and not p._procs
        monkeypatch.setattr(poolmod, "LAZY_START_BUILD_SECONDS", 0.0)
        shared = p.run(jobs)  # starts the worker, waits for its import, deals it a job
        assert len(p._procs) == 1
        # dealt largest (most marks) first: the marked build to this process, the other to the worker
        assert [r.worker for r in shared] == [p.names[1], "main"]
        for a, b in zip(fast, shared):  # the same build gives the same numbers in either process
            assert a.outputs[0].keys() == b.outputs[0].keys()
            for k in a.outputs[0]:
                np.testing.assert_array_equal(a.outputs[0][k], b.outputs[0][k])
    finally:
        p.close()


OUT = "blk15/ln/add_beta:0"  # deep_stack's graph output


def _started_pool(samples, workers=2):
    import numpy as np

    from bisect_tui.core.bisect import pool as poolmod
    from bisect_tui.engines.registry import get_engine

    feeds = [{"x": np.random.default_rng(0).standard_normal((1, 8, 32)).astype(np.float32)}]
    p = poolmod.BuildPool(workers, "ort")
    p.start()  # before the inputs are known, as the bisect command does
    p.attach(get_engine("ort"), "ort", str(samples / "deep_stack.onnx"), feeds, [OUT])
    assert all(w.ready.wait(60) for w in p._procs)
    return p


def test_pool_round_keeps_the_jobs_order_and_only_graph_outputs(samples):
    from bisect_tui.core.bisect import pool as poolmod

    cfg = EngineConfig(config_entries=GELU).to_dict()
    marks = [(), ("blk0/ln/mean:0",), ("blk0/ln/mean:0", "blk1/ln/mean:0"), ("blk11/gelu/erf:0",)]
    jobs = [poolmod.BuildJob(config=cfg, marks=m) for m in marks]
    p = _started_pool(samples)
    try:
        shared = p.run(jobs)
        names = p.names
    finally:
        p.close()
    serial = poolmod.BuildPool(1, "ort")
    serial.attach(p.engine, "ort", p.model_path, p.feeds, [OUT])
    alone = serial.run(jobs)
    # dealt by size (marks 2, 1, 1, 0: jobs 2, 1, 3, 0) in turn to main and the worker
    assert [r.worker for r in shared] == [names[1], names[1], "main", "main"] and names[0] == "main"
    for a, b in zip(alone, shared):  # same job, same place in the list, same numbers
        assert list(a.outputs[0]) == list(b.outputs[0]) == [OUT]  # marked tensors are not sent back
        assert (a.outputs[0][OUT] == b.outputs[0][OUT]).all()
    # the erf-Gelu of block 11 marked: its fusion blocked, so that output differs from the fused engine's
    assert (shared[3].outputs[0][OUT] != shared[0].outputs[0][OUT]).any()


def test_pool_worker_faults_come_back_as_what_they_are(samples):
    import os
    import signal

    from bisect_tui.core.bisect import pool as poolmod
    from bisect_tui.core.errors import UserError

    bad = EngineConfig(config_entries=GELU).to_dict() | {"level": "bogus"}
    p = _started_pool(samples)
    try:
        with pytest.raises(UserError, match="unknown optimization level"):
            p.run([poolmod.BuildJob(config=bad, marks=()), poolmod.BuildJob(config=bad, marks=("blk0/ln/mean:0",))])
        # a worker the OS killed: the round stops with an internal error naming it, never a verdict
        os.kill(p._procs[0].proc.pid, signal.SIGKILL)
        p._procs[0].proc.join(10)
        good = EngineConfig(config_entries=GELU).to_dict()
        with pytest.raises(RuntimeError, match=f"build worker {p._procs[0].name} stopped"):
            p.run([poolmod.BuildJob(config=good, marks=m) for m in [("blk0/ln/mean:0",), ("blk1/ln/mean:0",)] * 3])
    finally:
        p.close()


def test_devices_give_each_worker_its_own_accelerator(samples, cases, tmp_path, capsys, monkeypatch):
    """--devices 3,5: this process builds on device 3, one worker on device 5,
    each seeing only its own (CUDA_VISIBLE_DEVICES, set before the engine loads).
    CPU ORT ignores the variable, so the same culprit comes out here; the
    worker's name carries its device and the worker process really saw it."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    res = _cli_bisect_deep_stack(samples, tmp_path, "--devices", "3,5")
    assert res["parallel"]["workers"] == 2 and res["parallel"]["devices"] == ["3", "5"]
    assert culprit_matches(res["culprits"][0]["original_nodes"], cases["deep_stack"]["expected_culprits"][0])
    workers = {s.get("worker") for s in res["steps"] if not s["cached"] and s.get("worker")}
    assert "main" in workers and any(w.startswith("w") and w.endswith("@5") for w in workers)
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    capsys.readouterr()
    for bad in ("1,1", "x", "0,,1"):
        with pytest.raises(SystemExit) as exc:
            main(["bisect", str(samples / "deep_stack.onnx"), "--devices", bad])
        assert exc.value.code == 2
    assert "distinct device indices" in capsys.readouterr().err
