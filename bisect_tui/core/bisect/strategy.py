"""The search: which fused node(s) break tolerance, with as few builds as possible.

Plan (each numbered item is one or more engine builds, every one recorded in
`bisect/steps.jsonl` and reused on a rerun, which is how a search resumes):

1. The full engine (the user's config). Passing: nothing to find.
2. Every fusion blocked (all tensors marked). Still failing: the error is not
   a fusion's (precision, a kernel, or an op rewritten in place) and the search
   says so instead of blaming one.
3. Lower optimization levels first (basic, extended): the lowest failing level
   keeps the fused-node map fine-grained (no NCHWc trunk) and is searched.
4. The fused-graph probe (one run, no build) ranks fused nodes by their *own*
   error; the top suspects are tried alone first.
5. Otherwise a binary search over prefixes of the fused nodes in topological
   order (about log2(n) builds), then a check of the culprit alone; if it
   passes alone, its partners are searched (an interaction, reported as a set).
6. The culprit is held at the baseline (its interior stays marked) and the
   search repeats until the engine passes, so every culprit is reported.

Like a bisect marker, the strategy only proposes trials and learns pass or
fail: the store, the scheduler and the judge it is handed (trials.py) decide
how a trial is built, judged and kept. The checks that need the model's own
tensors (a suspect on its subgraph, a region in isolation, local judgement)
are hooks, filled in by `search.Bisector`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable, Optional

from bisect_tui.core.bisect import verdicts
from bisect_tui.core.bisect.records import Step
from bisect_tui.core.bisect.suspects import (MAX_SEED_TRIES, amplifies_rounding, engine_levels, probe_seeds,
                                             split_points, suspects_to_try, tries_suspect_first)
from bisect_tui.core.bisect.trials import BuildBudgetExceeded, Candidate, Trials
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.cancel import Progress
from bisect_tui.core.session import now_iso
from bisect_tui.api import EngineConfig


class Search(Trials):
    """The search for one engine config. `caps`: the engine's declared
    capabilities; `check`: the check's result for this engine (its sensitivity
    and, when `seed_from_check`, its full-engine verdict); `fanout`: candidates
    per round of the prefix search (1: binary search; k: k split points per
    round). The strategy alone decides the builds; the scheduler's pool only
    decides how many run at once."""

    def __init__(self, store, scheduler, judge, *, caps=None, check: Optional[dict] = None,
                 check_map=None, max_culprits: int = 5, fanout: int = 1, local_factor: float = 10.0, **trials):
        super().__init__(store, scheduler, judge, **trials)
        self.caps = caps
        self.check = check
        self.seed_from_check = check
        self.check_map = check_map
        self.max_culprits = max_culprits
        self.fanout = max(1, int(fanout))
        self.local_factor = local_factor
        # isolation and attribution per culprit (findings.py), set by run.py: lets the
        # attribution's confirming build stand for "remaining fusions"
        self.findings = None
        # a later fixpoint round: the user's config, whose workaround tests each pass alone
        self.workaround_base: Optional[EngineConfig] = None
        # ... and the original nodes of the culprits earlier rounds found: the fused node
        # that now covers them (another pass fusing them just as wrongly) is tried first
        self.exposed: frozenset[str] = frozenset()
        self._late_seeds: Optional[Callable[[], list[Unit]]] = None
        self._exposed_hit: Optional[Unit] = None

    # --- hooks: checks on the model's own tensors (search.Bisector) -------------------
    def check_on_subgraph(self, u: Unit) -> Optional[dict]:
        """{"judgement", "seconds"} of `u` alone on its subgraph, or None."""
        return None

    def subgraph_file(self, u: Unit) -> Optional[Path]:
        return None

    def isolate_region(self, u: Unit, config: EngineConfig) -> dict:
        raise NotImplementedError("region isolation needs the baseline's tensors")

    def judge_locally(self, units: list[Unit], config: EngineConfig) -> dict:
        raise NotImplementedError("local judgement needs the baseline's tensors")

    # --- what the engine declares -----------------------------------------------------
    @property
    def _keepset(self) -> bool:
        return self.caps is None or self.caps.keep_high_precision

    @property
    def levels(self) -> tuple[str, ...]:
        """The engine's optimization levels, lowest (everything off) first."""
        return engine_levels(self.caps)

    def amplifies(self) -> bool:
        """The check's sensitivity: a 1-ulp input change already breaks the tolerance."""
        return amplifies_rounding(self.check)

    def can_prefetch(self) -> bool:
        return self.scheduler.can_prefetch()

    # --- the steps of the search ----------------------------------------------------
    def find_level(self) -> tuple[str, Step]:
        """Lowest optimization level (up to the user's) whose engine fails."""
        levels = self.levels
        top = levels.index(self.config.level)
        last = None
        for lvl in levels[1: top + 1]:
            step = self.evaluate(f"level {lvl}", None, self.config.with_level(lvl))
            last = (lvl, step)
            if not step.passed:
                return lvl, step
        assert last is not None
        return last

    def prefix_search(self, cands: list[Unit], held: list[Unit], fixed: list[Unit]) -> Optional[int]:
        """Smallest k with fixed + cands[:k+1] failing (cands[:] known to fail with fixed).

        Each round tries `fanout` split points at once (one round of a binary
        search when fanout is 1): the first failing one bounds the answer from
        above, the last passing one below it from below."""
        lo, hi = 0, len(cands) - 1
        while lo < hi:
            mids = split_points(lo, hi, self.fanout)
            steps = self.evaluate_many([Candidate("bisect", fixed + cands[: m + 1], held=held) for m in mids])
            for m, step in zip(mids, steps):
                if step.passed:
                    lo = m + 1
                else:
                    hi = m
                    break
        return lo if cands else None

    def find_one(self, remaining: list[Unit], held: list[Unit], seeds: list[Unit]) -> Optional[list[Unit]]:
        """One culprit (a unit, or a set of units that only fail together)."""
        tries = [s for s in seeds if s in remaining][:MAX_SEED_TRIES]
        for at in range(0, len(tries), self.fanout):
            batch = tries[at: at + self.fanout]
            for s, step in zip(batch, self.suspects_alone(batch, held)):
                if not step.passed:
                    return [s]
        k = self.prefix_search(remaining, held, [])
        if k is None:
            return None
        culprit = remaining[k]
        if not self.evaluate("culprit alone", [culprit], held=held).passed:
            return [culprit]
        # An interaction: the culprit needs earlier fusions to fail.
        fixed = [culprit]
        cands = remaining[:k]
        while cands:
            j = self.prefix_search(cands, held, fixed)
            if j is None:
                break
            fixed = [cands[j]] + fixed
            if not self.evaluate("interaction", fixed, held=held).passed:
                return sorted(fixed, key=lambda u: u.index)
            cands = cands[:j]
        return sorted(fixed, key=lambda u: u.index)

    def suspects_alone(self, batch: list[Unit], held: list[Unit]) -> list[Step]:
        """Each suspect with every other fusion blocked: on its own subgraph
        where that stands for the whole graph (subgraph_check.py), else by a
        whole-graph build (one round for those)."""
        out: list[Optional[Step]] = [self.subgraph_step(u, lambda u=u: self.check_on_subgraph(u)) for u in batch]
        rest = [i for i, st in enumerate(out) if st is None]
        if rest:
            steps = self.evaluate_many([Candidate("suspect alone", [batch[i]], held=held) for i in rest])
            for i, st in zip(rest, steps):
                out[i] = st
        return out  # type: ignore[return-value]

    def _suspect_at_user_level(self, probe_fn: Callable) -> Optional[Unit]:
        """The probe of the user's own engine (the check already built it) names
        fused nodes whose error is their own. When one of them alone, every other
        fusion blocked, already breaks the tolerance, the search stays at the
        user's level: the level-by-level builds would only say at which level
        that fusion appears, which its pass (the attribution) says too."""
        try:
            units, optimized = self.units_at(self.config.level)
        except RuntimeError:
            return None
        if not optimized:
            return None
        hit = self._exposed_suspect(units)
        if hit is not None:
            return hit
        batch = suspects_to_try(self.caps, units, probe_fn(optimized, units))
        batch = batch[: max(1, min(self.fanout, MAX_SEED_TRIES))]
        if not batch:
            return None
        self._prefetch_attribution(batch[0])
        steps = self.suspects_alone(batch, [])
        return next((u for u, st in zip(batch, steps) if not st.passed), None)

    def _exposed_suspect(self, units: list[Unit]) -> Optional[Unit]:
        """In a later fixpoint round, a fused node over an earlier culprit's nodes that
        alone breaks the tolerance (on its subgraph, else a build): the culprit the
        disabled pass exposed, found without the probe of this round's whole graph
        (run later only if the round has more culprits to find)."""
        coarse = set(getattr(self.caps, "coarse_domains", ()) or ())
        batch = [u for u in units if u.blockable and u.domain not in coarse
                 and self.exposed.intersection(u.original_nodes)][:MAX_SEED_TRIES]
        if not batch:
            return None
        self._prefetch_attribution(batch[0])
        self._prefetch_rest(units, batch[0])
        steps = self.suspects_alone(batch, [])
        hit = next((u for u, st in zip(batch, steps) if not st.passed), None)
        self._exposed_hit = hit
        return hit

    def _prefetch_rest(self, units: list[Unit], u: Unit) -> None:
        """The round's "remaining fusions" with `u` held (the build it ends on), started
        beside the work before it; in a later round before `u` is even tried alone, as
        the fused node over an earlier culprit's nodes is most often the culprit the
        disabled pass exposed. At the search's priority: a lower one only queued it behind
        the suspect's checks (docs/benchmarks.md, section 4, seventh pass). A suspect
        that passes alone leaves it unasked: not a step, not counted."""
        rest = self._rest_with(units, u)
        if rest is not None:
            self.prefetch(rest)

    @staticmethod
    def _rest_with(units: list[Unit], u: Unit) -> Optional[Candidate]:
        """The round's "remaining fusions": every other blockable fusion free, `u` held."""
        rest = [x for x in units if x.blockable and x != u]
        return Candidate("remaining fusions", rest, held=[u]) if rest else None

    def _prefetch_attribution(self, u: Unit) -> None:
        """The suspect's pass, found now on its subgraph (its tags, else group
        testing: tiny builds), and the full engine with that pass disabled built
        in a thread from here on: once the suspect is confirmed, its attribution
        and the rest proof ask for exactly that build, which otherwise ran alone
        at the end of the search while the second core idled. A suspect that is
        not confirmed leaves an unasked prefetch: not a step, not counted."""
        if self.findings is None or not self.can_prefetch():
            return
        for c in self.findings.early_configs([u], self.config, lambda: self.subgraph_file(u)):
            self.prefetch(Candidate(self.map_kind(c), None, c))
        # with that pass off another may fuse the same nodes: the next round's build, guessed
        for c in self.findings.next_round_configs([u], self.config, lambda: self.subgraph_file(u)):
            self.prefetch(Candidate(self.map_kind(c), None, c), guess=True)

    def _behind(self, group: list[Unit]) -> bool:
        """Disabling `group`'s pass lets another pass fuse its nodes (its subgraph tests,
        findings.Findings.exposes_fusion): the attribution's build then holds that fusion."""
        return self.findings is not None and self.findings.exposes_fusion(group, self.config)

    def _rest_proof(self, culprits: list[list[Unit]], units: list[Unit], saved: EngineConfig,
                    level: str) -> Optional[Step]:
        """The attribution's confirming build, when it proves the other fusions pass
        (findings.rest_proof); only at the user's own level, where it is the build
        the fixpoint and the workaround read next."""
        if not culprits or self.findings is None or level != saved.level:
            return None
        self.config, inner = saved, self.config
        try:
            return self.findings.rest_proof(culprits, units, saved)
        finally:
            self.config = inner

    def _prefetch_workaround(self, culprits: list[list[Unit]], level: str) -> None:
        """In a later fixpoint round, the user's engine with each pass this round found
        disabled alone: the workaround tries each pass alone first and, once this round's
        passes are known, its build is certain (attribution.find_workaround), so it is
        made on the second core while "remaining fusions" builds; not recorded unless asked."""
        if self.workaround_base is None or self.findings is None or not self.can_prefetch():
            return
        cfg = self.config.with_level(level)
        for g in culprits:
            for name in (self.findings.made(g, cfg) or {}).get("confirmed", []):
                if self.workaround_kept(name):
                    continue  # the workaround reads it off a culprit's subgraph (attribute_subgraph.py)
                c = self.workaround_base.with_disabled([name])
                self.prefetch(Candidate("workaround", None, c))

    # --- the whole search ----------------------------------------------------------------
    def run(self, probe_fn: Optional[Callable] = None) -> dict:
        """Search; returns the JSON-able search result (culprits as unit indices)."""
        t0 = time.perf_counter()
        result: dict = {"started": now_iso(), "config": self.config.to_dict()}
        self.seed_full_engine(self.seed_from_check, self.check_map)
        full = self.evaluate("full engine", None)
        result["full_engine"] = full.to_json()
        if full.error_kind:
            result["engine_error"] = {"kind": full.error_kind, "message": full.error}
            probe_fn = None  # the probe runs the failing program too
        if full.passed:
            result.update(verdict="pass", culprits=[], units=[], level=self.config.level)
            return self._finish(result, t0)
        # in an amplifying model the lowest failing level only shows amplified reordering:
        # every fusion of the user's level is judged locally instead
        users_level = not tries_suspect_first(self.caps, self.config, self.check)
        confirmed, blocked = self._first_round(probe_fn, users_level)
        result["all_blocked"] = blocked.to_json()
        level = self.config.level if users_level or confirmed is not None else self.find_level()[0]
        result["level"] = level
        try:
            units, optimized = self.units_at(level)
        except RuntimeError:
            # the failing engine has no optimized graph to map; the engine with
            # every fusion blocked is the reference the region search needs
            units, optimized = [], None
            if result.get("engine_error") and blocked.passed:
                from bisect_tui.core.bisect import engine_errors

                units, optimized = engine_errors.failing_run_units(self, level) or ([], None)
                result["engine_error"].update(engine_errors.named_in_error(full.error, self.index, units))
                if not units:
                    return self._finish(engine_errors.region_search(self, result, level), t0)
        result["units"] = [u.to_dict() for u in units]
        result["optimized_model"] = optimized
        unblocked = self._unblocked(result, blocked, units)
        if not blocked.passed and unblocked and units:
            # marking is not this engine's switch for these fusions: judge each
            # region alone, through the engine, on the baseline's own tensors
            return self._finish(self._isolated_verdict(result, units, self.config.with_level(level), unblocked), t0)
        if not blocked.passed:
            result.update(verdict="not_fusion", culprits=[], unblockable=[u.index for u in units if not u.blockable],
                          explanation=verdicts.not_fusion(self.config.precision != "fp32", self._keepset))
            if probe_fn and optimized:
                result["probe"] = probe_fn(optimized, units)
            return self._finish(result, t0)
        searchable = [u for u in units if u.blockable]
        self._expect(searchable)
        seeds: list[Unit] = []
        if probe_fn and optimized and confirmed is not None and confirmed is self._exposed_hit:
            # the suspect came from the earlier round's culprit: the probe only when
            # the round has another culprit to find
            seeds = [confirmed]
            self._late_seeds = lambda: probe_seeds(units, result.setdefault("probe", probe_fn(optimized, units)))
        elif probe_fn and optimized:
            probe = probe_fn(optimized, units)
            result["probe"] = probe
            seeds = probe_seeds(units, probe)
        if self.amplifies() and units:
            return self._finish(self._local_verdict(result, units, self.config.with_level(level)), t0)
        return self._finish(self._every_culprit(result, units, searchable, seeds, level, confirmed), t0)

    def _first_round(self, probe_fn: Optional[Callable], users_level: bool) -> tuple[Optional[Unit], Step]:
        """The probe's suspect tried alone (when the search starts from it), then
        "all fusions blocked", with what the search will ask next in the same round."""
        confirmed: Optional[Unit] = None
        blocked_cand = Candidate("all fusions blocked", None, marks=list(self._all_tensors))
        if not users_level and probe_fn:
            # the probe of the user's own engine (the check built it) and its suspect on
            # its subgraph: no whole-graph build yet, but the blocked build comes next
            # whatever the suspect does: it is built meanwhile
            self.prefetch(blocked_cand)
            confirmed = self._suspect_at_user_level(probe_fn)
            if confirmed is not None and (self.exposed or self._behind([confirmed])):
                # the round's "remaining fusions" (_every_culprit prefetches it once the
                # culprit is held): started now, beside the suspect's isolation
                self._prefetch_rest(self.units_at(self.config.level)[0], confirmed)
        first = [blocked_cand]
        spec = []
        if confirmed is not None and self.findings is not None:
            # the suspect's isolation and the group test of its pass, on subgraphs only:
            # made now, while the blocked build (prefetched) runs, instead of after it
            spec = self.findings.speculative_configs([confirmed], self.config, self.findings.first_index)
        if confirmed is not None and self.fanout > 1:
            # speculative, in the same round (the strategy's, so any number of workers
            # makes the same builds): what the search asks next when the blocked build
            # passes. The suspect's attribution builds (its pass disabled), which also
            # stand for the other fusions (findings.py); else the other fusions with
            # the suspect held.
            if spec:
                first += [Candidate(self.map_kind(c), None, c) for c in spec]
            else:
                rest = self._rest_with(self.units_at(self.config.level)[0], confirmed)
                if rest is not None:
                    first.append(rest)
        self.blocked = self.evaluate_many(first)[0]
        return confirmed, self.blocked

    def _unblocked(self, result: dict, blocked: Step, units: list[Unit]) -> Optional[list[str]]:
        """The fusions marking left in place in the blocked build, unless the same
        engine in FP32 passes (then the error is the reduced precision's)."""
        if not blocked.passed and blocked.unblocked and units and self.config.precision != "fp32":
            fp32 = self.evaluate("full engine in FP32", None, self.config.with_precision("fp32"))
            result["fp32_engine"] = fp32.to_json()
            return None if fp32.passed else blocked.unblocked
        return blocked.unblocked

    def _expect(self, searchable: list[Unit]) -> None:
        """About how many builds the rest of the search takes (the progress bar's total)."""
        self.expected_builds = self.builds + max(1, math.ceil(math.log2(max(len(searchable), 1)))) + 2

    def _every_culprit(self, result: dict, units: list[Unit], searchable: list[Unit], seeds: list[Unit],
                       level: str, confirmed: Optional[Unit]) -> dict:
        """Culprit after culprit, each held at the baseline once found, until the
        remaining fusions pass together (or a budget stops the search)."""
        held: list[Unit] = []
        culprits: list[list[Unit]] = []
        self.config, saved = self.config.with_level(level), self.config
        stopped = None
        try:
            while True:
                remaining = [u for u in searchable if u not in held]
                if not remaining:
                    break
                if held or confirmed is None:
                    if held and (self.exposed or self._behind(culprits[-1])):
                        # a later round, or a culprit with another fusion behind it: the rest
                        # proof's build may fail, and this one comes next; built beside it
                        self.prefetch(Candidate("remaining fusions", remaining, held=held))
                    proof = self._rest_proof(culprits, units, saved, level)
                    if proof is not None:
                        result["rest_proven_by"] = {"step": proof.n, "kind": proof.kind, "ratio": proof.ratio,
                                                    "fused_nodes": proof.fused_in_build, "why": verdicts.REST_PROVEN}
                        break
                    if held:
                        self._prefetch_workaround(culprits, level)
                    check = self.evaluate("remaining fusions" if held else "all fusions at level",
                                          remaining, held=held)
                    if check.passed:
                        break
                # else: a suspect alone already fails at this level, so the fusions together
                # need no build to show that something fails; find_one names that suspect
                if len(culprits) >= self.max_culprits:
                    stopped = "max_culprits"
                    break
                if culprits and self._late_seeds is not None:
                    seeds, self._late_seeds = self._late_seeds(), None  # another culprit to find
                found = self.find_one(remaining, held, seeds)
                if not found:
                    break
                culprits.append(found)
                held.extend(found)
                self._expect(remaining)
        except BuildBudgetExceeded:
            stopped = "max_builds"
        finally:
            self.config = saved
        result["culprits"] = [[u.index for u in c] for c in culprits]
        result["verdict"] = "culprits" if culprits else "no_culprit"
        if stopped:
            result["stopped"] = stopped
            result["stopped_reason"] = verdicts.stopped(stopped, len(culprits),
                                                        len([u for u in searchable if u not in held]), self.builds)
        if not culprits and not stopped:
            result["explanation"] = verdicts.NO_CULPRIT
        return result

    def _isolated_verdict(self, result: dict, units: list[Unit], cfg_level: EngineConfig,
                          unblocked: list[str]) -> dict:
        """The engine-neutral second switch: when marking every tensor left
        fusions in place, each fused region is extracted, fed the baseline's own
        tensors, run through the engine and judged against the unfused result
        (the rest of the graph is held at the baseline by construction)."""
        rows, culprits = [], []
        for u in units:
            self.cancel.check()
            self.progress(Progress("bisect", f"region #{u.index} {u.fused_node} alone through the engine",
                                   u.index, len(units)))
            iso = self.isolate_region(u, cfg_level)
            worst = max((o.get("fused_vs_unfused", {}).get("max_abs") or 0.0
                         for o in iso.get("outputs", {}).values()), default=None)
            rows.append({"unit": u.index, "fused_node": u.fused_node, "op_type": u.op_type,
                         "breaks_tolerance": bool(iso["reproduces"]), "max_abs": worst,
                         "build_error": iso.get("build_error")})
            if iso["reproduces"]:
                culprits.append([u.index])
        result["region_isolation"] = {"unblocked": list(unblocked), "units": rows}
        result["culprits"] = culprits
        result["verdict"] = "culprits" if culprits else "no_culprit"
        result["explanation"] = verdicts.regions_isolated(unblocked, len(culprits))
        return result

    def _local_verdict(self, result: dict, units: list[Unit], cfg_level: EngineConfig) -> dict:
        """In a model that amplifies rounding the outputs blame every fusion, so
        each fused node is judged alone against float64 instead; only the ones
        far worse than the unfused FP32 ops are culprits."""
        local = self.judge_locally(units, cfg_level)
        result["local_judgement"] = local
        by_idx = {u.index: u for u in units}
        worse = [by_idx[i] for i in local["worse"]]
        result["culprits"] = [[u.index] for u in worse]
        result["verdict"] = "culprits" if worse else "no_culprit"
        if worse:
            # how far the engine gets with the wrong ones held unfused (the rest is amplified rounding)
            held = [u for u in worse if u.blockable]
            rest = [u for u in units if u.blockable and u not in held]
            step = self.evaluate("local culprits held", rest, cfg_level, held=held)
            result["with_local_culprits_held"] = step.to_json()
        result["explanation"] = verdicts.judged_locally(local["factor"], len(worse), len(local["reorders_only"]))
        return result

    def _finish(self, result: dict, t0: float) -> dict:
        result["steps"] = [s.to_json() for s in self.steps]
        result["engine_builds"] = self.builds
        result["reused_steps"] = sum(1 for s in self.steps if s.cached)
        result["engine_builds_all_runs"] = self.store.count
        result["seconds"] = time.perf_counter() - t0
        return result
