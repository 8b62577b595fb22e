"""A culprit's candidate passes tested on its subgraph, one whole-graph build as proof.

attribution.attribute confirms each candidate pass (the culprit's node-name tags
mapped onto the engine's names: LayerNormFusion, LayerNormFusionL1,
LayerNormFusionL2 for one LayerNormalization) by a build of the whole graph
with it disabled. The same question, "is the culprit's fused node gone with
this pass off?", costs a build of a few nodes on the culprit's extracted
subgraph, and stands for the whole graph where the engine gives the same
answer there: with nothing more disabled it makes exactly the culprit's fused
node (same op, same original nodes), as the suspect's subgraph check requires
(subgraph_check.same_fusion). Each pass that removes it there is then built
once on the whole graph, with that pass disabled: the build the fixpoint and
the workaround ask for next, so the proof costs nothing more. A pass the whole
graph does not confirm, a subgraph that fuses otherwise, an interaction (a set
of fused nodes), a single candidate (its whole-graph build is needed as the
proof anyway) or an untagged culprit (group testing, already on the subgraph)
leave the attribution to attribute(), which reuses every build made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from bisect_tui.core.bisect.attribution import candidate_passes, first_guesses
from bisect_tui.core.bisect.subgraph_check import same_fusion
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.errors import EnvironmentFault

HOW = "node-name tag, confirmed by a rebuild"


def still_there(fused, unit: Unit) -> bool:
    """The culprit's own fused node (same op, same original nodes) is in `fused`."""
    return any(f.is_fused and f.op_type == unit.op_type and set(f.original_nodes) == set(unit.original_nodes)
               for f in fused)


def made_by(fused, unit: Unit) -> Optional[str]:
    """The op of the node that now computes the culprit's last original node."""
    last = unit.original_nodes[-1]
    return next((f.op_type for f in fused if last in f.original_nodes), None)


def subgraph_map(engine, subgraph: Path, cfg):
    try:
        built = engine.build(subgraph, cfg, (), None)
    except EnvironmentFault:
        raise
    except Exception:  # noqa: BLE001 - a subgraph that does not build tells nothing
        return None
    try:
        return list(built.fused_nodes)
    except Exception:  # noqa: BLE001 - an engine without a map cannot stand for the whole graph
        return None
    finally:
        built.close()


def fused_over(fused, unit: Unit) -> list[str]:
    """The ops of the fused nodes (other than the culprit's own) that take in any of its
    original nodes: another pass fusing them once the culprit's pass is off."""
    own = set(unit.original_nodes)
    return sorted({f.op_type for f in fused if f.is_fused and own.intersection(f.original_nodes)
                   and not (f.op_type == unit.op_type and set(f.original_nodes) == own)})


def subgraph_tests(engine, subgraph: Optional[Path], cfg, units: list[Unit], cancel=None,
                   over: Optional[dict] = None) -> Optional[dict]:
    """{name: (gone, now made by)} for each tagged candidate pass, on the subgraph
    ("": the builds made, nothing disabled first); None where the subgraph does not
    stand for the whole graph (see the module). `over`, when given, gets
    {name: fused_over(...)} of the same builds."""
    caps = getattr(engine, "capabilities", None)
    if subgraph is None or len(units) != 1 or (caps is not None and not caps.pass_switches):
        return None
    unit = units[0]
    names = candidate_passes(engine, units, engine.known_passes())
    if len(names) < 2 or not unit.original_nodes:
        return None  # one candidate: its whole-graph build is the proof either way
    plain = subgraph_map(engine, subgraph, cfg)
    if plain is None or not same_fusion(unit, plain):
        return None
    out: dict[str, tuple] = {"": (len(names) + 1, made_by(plain, unit))}
    for name in names:
        if cancel is not None:
            cancel.check()
        fused = subgraph_map(engine, subgraph, cfg.with_disabled([name]))
        if fused is None:
            return None
        out[name] = (not still_there(fused, unit), made_by(fused, unit))
        if over is not None:
            over[name] = fused_over(fused, unit)
    return out


def confirmed_names(tests: Optional[dict]) -> Optional[list[str]]:
    """The passes whose disabling removes the culprit on its subgraph, in candidate order."""
    if tests is None:
        return None
    return [n for n, (gone, _) in tests.items() if n and gone]


def attribute_on_subgraph(bisector, units: list[Unit], tests: Optional[dict]) -> Optional[dict]:
    """attribute()'s record from the subgraph's tests and one whole-graph build per
    pass they confirm (its map must agree); None to leave it to attribute()."""
    names = confirmed_names(tests)
    if not names:
        return None
    unit = units[0]
    known = bisector.engine.known_passes()
    proofs = {}
    bisector.prefetch_maps([bisector.config.with_disabled([n]) for n in names])
    for name in names:
        fused, _, step = bisector.fused_map(bisector.config.with_disabled([name]))
        if fused is None or still_there(fused, unit):
            return None  # the whole graph disagrees: every pass on whole-graph builds
        proofs[name] = made_by(fused, unit)
    rows = []
    for name, (gone, now) in tests.items():
        if not name:
            continue
        rows.append({"optimizer": name, "known_to_engine": name in known, "culprit_gone_when_disabled": gone,
                     "output_now_made_by": proofs.get(name, now),
                     "tested_on": "whole graph" if name in proofs else "subgraph"})
    return {"tags": sorted({t for u in units for t in u.optimizers}), "candidates": rows, "confirmed": names,
            "group_test": None, "how": HOW, "subgraph_builds": tests[""][0]}


def culprit_kept(bisector, groups: list[list[Unit]], name: str) -> Optional[dict]:
    """Why the full engine with only `name` disabled keeps a culprit, found on that
    culprit's subgraph instead of a whole-graph build (the workaround's test of one pass
    alone, attribution.find_workaround): a culprit of this search, not made by `name`,
    whose subgraph stands for the whole graph (its tagged passes were tested there: it
    makes exactly the culprit's fused node) and, built with `name` disabled, still makes
    it; and which is further from float64 than the unfused FP32 ops in isolation. None
    where any of that is not on record: the whole graph is built as before."""
    if not hasattr(bisector, "t"):
        return None
    memo = vars(bisector.t).setdefault("culprit_kept", {})  # asked by the prefetch and the workaround
    if name not in memo:
        memo[name] = _culprit_kept(bisector, groups, name)
    return memo[name]


def culprits_of_search(bisector) -> list[list[Unit]]:
    """The culprits a search has attributed at its own config (its Findings), as units."""
    findings = getattr(bisector, "findings", None)
    if findings is None or not hasattr(findings, "_attr"):
        return []
    try:
        units, _ = bisector.units_at(bisector.config.level)
    except RuntimeError:
        return []
    by_idx = {u.index: u for u in units}
    cfg_key = findings._key([], bisector.config)[0]
    return [[by_idx[i] for i in idx] for (c, idx) in findings._attr if c == cfg_key and all(i in by_idx for i in idx)]


def _culprit_kept(bisector, groups: list[list[Unit]], name: str) -> Optional[dict]:
    findings = getattr(bisector, "findings", None)
    tested = vars(bisector.t).get("pass_tests", {})
    if findings is None or not hasattr(findings, "_iso"):
        return None
    cfg = bisector.config
    for k, group in enumerate(groups):
        if len(group) != 1:
            continue
        key = findings._key(group, cfg)
        iso, tests = findings._iso.get(key), tested.get(key)
        made = findings.made(group, cfg) or {}
        if not iso or not iso.get("subgraph") or not tests or name in (made.get("confirmed") or [name]):
            continue
        worse = [o.get("fused_worse") for o in (iso.get("outputs") or {}).values() if "fused_worse" in o]
        if not worse or not all(worse):
            continue  # not shown to be a real culprit in isolation
        unit = group[0]
        fused = subgraph_map(bisector.engine, Path(iso["subgraph"]), cfg.with_disabled([name]))
        if fused is None or not still_there(fused, unit):
            continue
        bisector.subgraph_builds += 1
        return {"culprit_kept": unit.fused_node, "original_nodes": list(unit.original_nodes),
                "made_by": made.get("confirmed"), "tested_on": "subgraph",
                "summary": (f"not built: with {name} disabled the engine still makes culprit "
                            f"{unit.fused_node} ({unit.op_type}) on its subgraph, which stands for the whole "
                            f"graph, and that fused node alone breaks the tolerance")}
    return None


def guesses_on(engine, group: list[Unit], cfg, sub: Optional[Path], cancel,
               tests: Callable[[], Optional[dict]]) -> tuple[list[str], Optional[dict]]:
    """findings.pass_guesses without its memo: first_guesses, then, for tagged candidates, only
    those that remove the culprit on its subgraph (`tests()`: subgraph_tests) are
    worth a whole-graph build; all of them where it cannot tell."""
    got = first_guesses(engine, cfg, group, sub, cancel)
    if sub is not None and got[1] is None:
        names = confirmed_names(tests())
        got = (names, None) if names else got
    return got
