"""Which pass made the culprit, and which passes to disable to pass.

The tags an engine writes on a fused node say which passes it applied, but
tags are not always the names the engine accepts for disabling, names change
between releases, and an engine may ignore unknown names silently. So every
candidate is *confirmed* by rebuilding with it disabled and checking that the
culprit fused node is gone, and a workaround is only proven by rebuilding the
full engine and judging it. The engine turns tags into names
(`pass_candidates`) and may read its own log of the passes that ran
(`modifying_passes`).
"""

from __future__ import annotations

from typing import Optional

from bisect_tui.api import DISABLED_KEY
from bisect_tui.core.bisect.units import Unit


def candidate_passes(engine, units: list[Unit], known: set[str]) -> list[str]:
    """Names worth confirming first for a culprit: its node-name tags, mapped
    by the engine onto the names it accepts. Untagged culprits get none here:
    group testing over every name the engine knows finds their pass."""
    return engine.pass_candidates([t for u in units for t in u.optimizers], known)[:8]


def _culprit_present(fused, units: list[Unit]) -> Optional[str]:
    """The op type of a fused node that is still *this* culprit, if any: same
    op, covering exactly the same original nodes.

    Matched by the original nodes covered, not by output tensor names: engines
    rename outputs (fp16 casts, layout rewrites). A fused node that now covers
    fewer or other nodes is another fusion (made by another pass): the search
    after disabling this one judges it on its own."""
    ops = {u.op_type for u in units}
    covered = {n for u in units for n in u.original_nodes}
    for f in fused:
        if f.is_fused and f.op_type in ops and covered == set(f.original_nodes):
            return f.op_type
    if len(units) > 1:  # an interaction: any one of its fused nodes still there
        for u in units:
            for f in fused:
                if f.is_fused and f.op_type == u.op_type and set(u.original_nodes) == set(f.original_nodes):
                    return f.op_type
    return None


def group_test(engine, subgraph, cfg, units: list[Unit], names: list[str], cancel=None) -> dict:
    """Which single pass, disabled, removes the culprit from its extracted subgraph?

    Binary search over the sorted pass names of the installed engine: disable
    half, build the subgraph (tiny, milliseconds), see whether the culprit's
    fused node is still there. About log2(len(names)) + 2 builds. Finds the
    first such name in sorted order; other passes that also make the node are
    left to the fixpoint search (disable this one, search again)."""
    builds = 0
    rows: list[dict] = []

    memo: dict[tuple, Optional[bool]] = {}

    def gone(disabled: list[str]) -> Optional[bool]:
        key = tuple(disabled)
        if key not in memo:
            memo[key] = _gone(disabled)
        return memo[key]

    def _gone(disabled: list[str]) -> Optional[bool]:
        nonlocal builds
        if cancel is not None:
            cancel.check()
        builds += 1
        try:
            built = engine.build(subgraph, cfg.with_disabled(disabled), (), None)
        except Exception as exc:  # noqa: BLE001 - a failing build tells nothing about the node
            rows.append({"disabled": len(disabled), "first": disabled[0] if disabled else None,
                         "error": str(exc).splitlines()[0][:200]})
            return None
        try:
            present = _culprit_present(built.fused_nodes, units) is not None
        finally:
            built.close()
        rows.append({"disabled": len(disabled), "first": disabled[0] if disabled else None,
                     "last": disabled[-1] if disabled else None, "culprit_gone": not present})
        return not present

    out = {"names": len(names), "found": None, "builds": 0, "tests": rows}
    if gone([]) is not False or not gone(names):
        # not fused in isolation, or no pass set switches it off (a kernel, an EP rewrite)
        out["builds"] = builds
        return out
    cands = list(names)
    while len(cands) > 1:
        half = cands[: len(cands) // 2]
        cands = half if gone(half) else cands[len(cands) // 2:]
    if len(cands) == 1 and gone(cands):
        out["found"] = cands[0]
    out["builds"] = builds
    # cross-check with what the engine itself logs about the passes that changed the subgraph
    logged = engine.modifying_passes(subgraph, cfg)
    if logged is not None:
        out["engine_log_modified"] = logged
        if out["found"]:
            out["engine_log_agrees"] = out["found"] in logged
            note = None if out["engine_log_agrees"] else engine.pass_log_note(out["found"], logged)
            if note:
                out["engine_log_note"] = note
    return out


def _now_made_by(fused, units: list[Unit]) -> Optional[str]:
    last = units[-1].original_nodes[-1]
    for f in fused:
        if last in f.original_nodes:
            return f.op_type
    return None


def _fused_map(bisector, cfg):
    """The fused-node map of the full engine built with `cfg` (a step of the
    search, so the workaround reuses it), or the build error as a string."""
    fused, _, step = bisector.fused_map(cfg)
    return fused if fused is not None else step.summary


def _no_switches(engine) -> bool:
    return not engine.capabilities.pass_switches


def first_guesses(engine, config, units: list[Unit], subgraph=None, cancel=None) -> tuple[list[str], Optional[dict]]:
    """The passes attribute() rebuilds the full engine (of `config`) without first,
    found without a whole-graph build: the culprit's tags, else group testing on its
    subgraph (returned too, for attribute's `grouped`)."""
    if _no_switches(engine):
        return [], None
    known = engine.known_passes()
    cands = candidate_passes(engine, units, known)
    if cands or subgraph is None:
        return cands, None
    names = sorted(set(known) - set(config.disabled_passes))
    grouped = group_test(engine, subgraph, config, units, names, cancel)
    return ([grouped["found"]] if grouped["found"] else []), grouped


def attribute(bisector, units: list[Unit], subgraph=None, grouped: Optional[dict] = None) -> dict:
    """Confirm the candidate passes of one culprit by rebuilding without each;
    when no tag confirms, find the pass by group testing on the culprit's
    extracted subgraph, then confirm that one on the full engine.

    `grouped`: that group test, already made (first_guesses) for the same culprit
    and config."""
    engine = bisector.engine
    if _no_switches(engine):
        return {"tags": sorted({t for u in units for t in u.optimizers}), "candidates": [], "confirmed": [],
                "group_test": None,
                "how": f"not attributed to a pass: {engine.label or engine.name} has no pass switches"}
    known = engine.known_passes()
    cands = candidate_passes(engine, units, known)
    confirmed, rows = _confirm(bisector, units, cands, known)
    if not confirmed and subgraph is not None:
        if grouped is None:
            names = sorted(set(known) - set(bisector.config.disabled_passes))
            grouped = group_test(engine, subgraph, bisector.config, units, names, bisector.t.cancel)
        if grouped["found"]:
            more, more_rows = _confirm(bisector, units, [grouped["found"]], known)
            confirmed += more
            rows += more_rows
    return {"tags": sorted({t for u in units for t in u.optimizers}), "candidates": rows,
            "confirmed": confirmed, "group_test": grouped,
            "how": ("node-name tag, confirmed by a rebuild" if confirmed and not grouped else
                    "group testing over the installed engine's pass names on the extracted subgraph, "
                    "confirmed by a rebuild of the full engine" if confirmed else "unknown")}


def _confirm(bisector, units: list[Unit], cands: list[str], known) -> tuple[list[str], list[dict]]:
    confirmed, rows = [], []
    # independent rebuilds, one per name: one round, spread over the workers
    bisector.prefetch_maps([bisector.config.with_disabled([name]) for name in cands])
    for name in cands:
        bisector.t.cancel.check()
        # a step of the search: shared by every culprit and by the workaround, reused on resume
        fused = _fused_map(bisector, bisector.config.with_disabled([name]))
        if isinstance(fused, str):
            rows.append({"optimizer": name, "known_to_engine": name in known,
                         "culprit_gone_when_disabled": None, "output_now_made_by": None,
                         "error": fused})
            continue
        gone = _culprit_present(fused, units) is None
        replaced = _now_made_by(fused, units)
        rows.append({"optimizer": name, "known_to_engine": name in known,
                     "culprit_gone_when_disabled": gone, "output_now_made_by": replaced})
        if gone:
            confirmed.append(name)
    return confirmed, rows


def find_workaround(bisector, culprits: list[list[Unit]], attributions: list[dict]) -> dict:
    """Smallest set of disabled passes with which the full engine passes."""
    # a search's hook (trials.Trials.culprit_kept_for): a pass alone that leaves a culprit in place
    culprit_kept = getattr(bisector, "culprit_kept_for", None) or (lambda groups, name: None)
    tried = []
    kept: dict[str, Optional[dict]] = {}

    def test(names: list[str]):
        cfg = bisector.config.with_disabled(names)
        if len(names) == 1 and hasattr(bisector, "has_step") and not bisector.has_step(cfg):
            # one pass alone that leaves another culprit in place (its subgraph says so):
            # it cannot pass, so the whole graph is not built for it (attribute_subgraph.py)
            if names[0] not in kept:
                kept[names[0]] = culprit_kept(culprits, names[0])
            if kept[names[0]] is not None:
                tried.append({DISABLED_KEY: sorted(names), "passed": False, "ratio": None, "max_abs": None,
                              "fused_nodes": None, "built": False, **kept[names[0]]})
                return None
        step = bisector.evaluate("workaround", None, cfg)
        tried.append({DISABLED_KEY: sorted(names), "passed": step.passed,
                      "ratio": step.ratio, "max_abs": step.max_abs,
                      "fused_nodes": step.fused_in_build, "summary": step.summary})
        return step

    confirmed = list(dict.fromkeys(n for a in attributions for n in a["confirmed"]))
    passing = []
    for name in confirmed:
        s = test([name])
        if s is not None and s.passed:
            passing.append(([name], s))
    if not passing and len(confirmed) > 1:
        names = list(confirmed)
        s = test(names)
        if s is not None and s.passed:
            for n in list(names):  # shrink greedily
                trial = [x for x in names if x != n]
                t = test(trial) if trial else None
                if t is not None and t.passed:
                    names = trial
            passing.append((names, None))
    if passing:
        best_names, _ = max(passing, key=lambda p: (-len(p[0]), (p[1].fused_in_build or 0) if p[1] else 0))
        best = next(t for t in tried if t[DISABLED_KEY] == sorted(best_names) and t["passed"])
        found = {"kind": "disable_optimizers", DISABLED_KEY: sorted(best_names),
                 "full_engine": best, "tried": tried}
        return {**found, "how": bisector.engine.workaround_text(found)}
    # No pass switch helps: keep the culprits unfused by marking one interior tensor each.
    interior = [u.interior[0] for c in culprits for u in c if u.interior]
    if interior:
        step = bisector.evaluate("workaround", None, marks=interior)
        entry = {"marked": interior, "passed": step.passed, "ratio": step.ratio,
                 "max_abs": step.max_abs, "summary": step.summary}
        tried.append(entry)
        if step.passed:
            found = {"kind": "mark_outputs", DISABLED_KEY: [], "marked_tensors": interior,
                     "full_engine": entry, "tried": tried}
            return {**found, "how": bisector.engine.workaround_text(found)}
    none = {"kind": None, DISABLED_KEY: [], "full_engine": None, "tried": tried}
    return {**none, "how": bisector.engine.workaround_text(none)}


__all__ = ["attribute", "candidate_passes", "find_workaround", "first_guesses", "group_test"]
