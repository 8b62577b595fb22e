"""Precision bisection: which original nodes must stay in FP32.

When a reduced-precision engine fails and fusion is not the cause, the user's
next question is "what do I keep in FP32?". Peers answer with a count of
layers; this answers with names, as a setting to paste (in the engine's own
words: its `workaround_text`), proven by building the full engine with it.

Every test is one full engine build with a keep-set, judged like any other
step of the search (so it is cached and resumable). Keeping more nodes in FP32
is assumed to never hurt, which makes "smallest prefix of a ranked list that
passes" a binary search. The ranking puts first what the evidence points at:
nodes named in the engine's error message, nodes fed by weights that FP16
cannot hold (initializers or `Constant` nodes) (overflow to inf, or underflow into subnormals), producers of the
range check's FP16 overflow tensors, and the probe's tensors with the largest
error; then every other node in graph order (`Constant` nodes last). Before
any of it counts, the control "keep everything" must reproduce the engine in
FP32 (keepset_control.py); then the seeds are tried, then everything. Up to
SMALL_SET nodes each node of the answer is necessary given the others (a
one-minimal set), found with about log2(candidates) builds per node. A model
that needs many nodes (FP16 error summed over a whole network: PP-OCRv4 rec
needs ~200 of 440) would spend hundreds of builds that way, so a larger pool
is first cut to its smallest passing prefix and then shrunk by dropping chunks
while the rest passes; every set reported passed a full engine build.
"""

from __future__ import annotations

import shlex

import re
from typing import Optional

import numpy as np

from bisect_tui.core.bisect.keepset_control import failed_explanation, run_control
from bisect_tui.core.bisect.records import KeepSet
from bisect_tui.core.external_data import tensor_array
from bisect_tui.core.bisect.trials import BuildBudgetExceeded

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 6.103515625e-05


def _float_weights(model):
    """(name, array) of every FP32 weight: initializers and the values of
    `Constant` nodes (Paddle2ONNX keeps its weights there)."""
    for t in model.graph.initializer:
        if t.data_type == 1:  # FLOAT only: the converter leaves other types alone
            yield t.name, t
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output:
            a = next((a for a in n.attribute if a.name == "value"), None)
            if a is not None and a.t.data_type == 1:
                yield n.output[0], a.t


def weight_findings(model) -> list[dict]:
    """Weights whose values FP16 cannot hold, with the nodes that read them."""
    consumers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.name)
    rows = []
    for name, t in _float_weights(model):
        a = np.abs(tensor_array(t).astype(np.float64)).reshape(-1)  # external data: from its file
        if a.size == 0:
            continue
        nz = a[a > 0]
        over = int((a > FP16_MAX).sum())
        under = float((nz < FP16_MIN_NORMAL).mean()) if nz.size else 0.0
        if over or under > 0.5:
            rows.append({"initializer": name, "nodes": consumers.get(name, []),
                         "abs_max": float(a.max()), "overflow_count": over,
                         "subnormal_share": under,
                         "finding": (f"{over} value(s) above FP16's max 65504" if over else
                                     f"{under:.0%} of its nonzero values are below FP16's smallest "
                                     "normal number (6.1e-05): they lose most of their digits")})
    return rows


def rank_candidates(triage, search: dict) -> tuple[list[str], list[dict]]:
    """Original node names, most suspect first, and why each seed is there."""
    index = triage.info.index
    order = list(index.by_name)  # graph (topological) order
    known = set(order)
    seeds: list[tuple[str, str]] = []

    def add(name: Optional[str], why: str) -> None:
        if name and name in known and all(name != s for s, _ in seeds):
            seeds.append((name, why))

    err = (search.get("engine_error") or {}).get("message") or ""
    for quoted in re.findall(r"\(([^()]+)\)|'([^']+)'", err):
        for q in quoted:
            add(q, "named in the engine's error message")
    for w in weight_findings(triage.info.model):
        for n in w["nodes"]:
            add(n, f"reads {w['initializer']}: {w['finding']}")
    fp16 = (triage.range_check or {}).get("fp16") or {}
    for row in fp16.get("overflow", []):
        add(row.get("node"), f"its output {row['tensor']} overflows FP16 in the baseline")
    probe = search.get("probe") or {}
    producer = {t: n for n, node in index.by_name.items() for t in node.output}
    if probe.get("first_failing_tensor"):
        add(producer.get(probe["first_failing_tensor"]), "first tensor out of tolerance in the fused graph")
    for row in probe.get("worst_tensors", [])[:8]:
        if not row.get("passed", True):
            add(producer.get(row["tensor"]), f"its output is x{row['ratio']:.3g} of the tolerance")
    seed_names = [s for s, _ in seeds]
    # a Constant computes nothing: its value follows its consumers (last, not out)
    rest = [n for n in order if n not in seed_names]
    ranked = seed_names + [n for n in rest if index.by_name[n].op_type != "Constant"] + \
        [n for n in rest if index.by_name[n].op_type == "Constant"]
    return ranked, [{"node": s, "why": why} for s, why in seeds]


SMALL_SET = 40  # one-minimal by binary search per node (about log2(n) builds each) up to this size
SHRINK_BUILDS = 64  # larger passing sets: chunks dropped while each drop still passes, this many builds at most


def _smallest_prefix(pool: list[str], passes, state: dict) -> list[str]:
    """The shortest prefix of `pool` (which passes whole) that passes: log2 builds."""
    lo, hi = 1, len(pool)
    while lo < hi:
        mid = (lo + hi) // 2
        if passes(pool[:mid]):
            hi = mid
            state["best"] = pool[:mid]
        else:
            lo = mid + 1
    return pool[:hi]


def _shrink(keep: list[str], passes, bisector, max_builds: int, state: dict) -> list[str]:
    """Drop chunks (halves, then quarters, ...) of a passing set while the rest
    still passes (ddmin's complement step); stops at SMALL_SET nodes or after
    `max_builds` builds, every intermediate set proven by a full build. A chunk
    that could not go once is not tried again at that size (keeping fewer
    nodes never helps), so each round halves the chunks."""
    start = bisector.builds
    size = -(-len(keep) // 2)
    while len(keep) > SMALL_SET and bisector.builds - start < max_builds:
        i = 0
        while i < len(keep) and len(keep) > SMALL_SET and bisector.builds - start < max_builds:
            trial = keep[:i] + keep[i + size:]
            if trial and passes(trial):
                keep = trial
                state["best"] = keep
            else:
                i += size
        if size == 1:
            break
        size = -(-size // 2)
    return keep


def _one_minimal(pool: list[str], passes, state: dict) -> list[str]:
    """Each node necessary given the others: the last needed node of the
    smallest passing prefix, repeated (about log2(len) builds per node)."""
    needed: list[str] = []
    while pool:
        if needed and passes(needed):
            break
        lo, hi = 1, len(pool)  # needed + pool[:hi] is known to pass
        while lo < hi:
            mid = (lo + hi) // 2
            if passes(needed + pool[:mid]):
                hi = mid
                state["best"] = needed + pool[:mid]
            else:
                lo = mid + 1
        needed.append(pool[lo - 1])
        pool = pool[: lo - 1]
    return needed


def precision_search(bisector, candidates: tuple[list[str], list[dict]], floor: Optional[float] = None) -> KeepSet:
    """Smallest proven keep-set for the engine config of `bisector`, over
    `candidates` (rank_candidates: node names most suspect first, the seeds).

    The control comes first (keepset_control): "keep every node" must
    reproduce the engine in FP32 before any keep-set test counts; `floor` is
    the FP32 rounding floor it is judged with."""
    cfg = bisector.config
    ranked, seeds = candidates
    start = bisector.builds
    tests: list[dict] = []
    control: Optional[dict] = None

    def passes(keep: list[str]) -> bool:
        step = bisector.evaluate(f"keep {len(keep)} in FP32", None, cfg.with_keep_fp32(keep))
        tests.append({"keep_fp32": sorted(keep), "passed": step.passed, "ratio": step.ratio,
                      "max_abs": step.max_abs, "summary": step.summary, "error_kind": step.error_kind})
        return step.passed

    engine = bisector.engine
    pin = engine.workaround_text({"kind": "keep_fp32"})

    def result(**found) -> KeepSet:
        return KeepSet(engine_pin=pin, candidates=len(ranked), seeds=seeds, tests=tests,
                       builds=bisector.builds - start, control=control,
                       **{"keep_fp32": [], "passed": False, **found})

    try:
        control = run_control(bisector, ranked, floor)
        if not control["reproduces_fp32"]:
            return result(instrument_failed=True, explanation=failed_explanation(control, pin))
        if not control["keep_all"]["passed"]:
            return result(explanation="even with every node kept in FP32 the engine fails, and that control "
                                      "reproduces the engine in FP32: the precision of single nodes is not the "
                                      "cause (inputs/outputs, a kernel, or the engine)")
        # the evidence first: when the seeds alone pass, the search stays among them
        seed_names = [s["node"] for s in seeds]
        pool = seed_names if seed_names and passes(seed_names) else ranked
        state = {"best": list(pool), "how": "one-minimal"}  # best: a keep-set known to pass
        try:
            if len(pool) > SMALL_SET:
                state["best"] = _smallest_prefix(pool, passes, state)
                state["best"] = _shrink(state["best"], passes, bisector, SHRINK_BUILDS, state)
            if len(state["best"]) <= SMALL_SET:
                state["best"] = _one_minimal(state["best"], passes, state)
            else:
                state["how"] = (f"not one-minimal: {len(state['best'])} nodes after {SHRINK_BUILDS} builds of "
                                "shrinking (every set tried passed with the full engine)")
        except BuildBudgetExceeded as exc:
            state["how"] = f"not one-minimal: {exc}; the smallest passing set so far"
        keep = sorted(state["best"], key=ranked.index)
        proof = bisector.evaluate(f"keep {len(keep)} in FP32", None, cfg.with_keep_fp32(keep))  # cached
        return result(keep_fp32=keep, passed=proof.passed, minimality=state["how"],
                      metrics={"ratio": proof.ratio, "max_abs": proof.max_abs, "summary": proof.summary},
                      setting=engine.workaround_text({"kind": "keep_fp32", "keep_fp32": keep}),
                      # a shell line the user copies: every node name quoted
                      cli=" ".join(f"--keep-fp32 {shlex.quote(n)}" for n in keep))
    except BuildBudgetExceeded as exc:
        return result(explanation=str(exc))


__all__ = ["precision_search", "rank_candidates", "weight_findings"]
