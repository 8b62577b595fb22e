"""One trial of the search, from proposal to verdict on record.

The strategy proposes candidates (which units may fuse, which are held, under
which config); this turns each into a plan with its key, reuses a verdict on
record (this run's, or an earlier run's from the store), hands the rest to
the scheduler in one round, has the judge decide each build and records the
steps in the order proposed, so the steps file, the verdicts and the build
count are the same however the builds were made. It also reads the engine's
fused-node map of an unmarked build (the units the strategy searches).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

from bisect_tui.core import atomic, safepath
from bisect_tui.core.bisect.judge import Judgement, TrialJudge
from bisect_tui.core.bisect.records import Step, step_config
from bisect_tui.core.bisect.scheduler import BuildScheduler, Plan
from bisect_tui.core.bisect.store import MemoryStore
from bisect_tui.core.bisect.units import Unit, build_units, marks_for, region_text
from bisect_tui.core.cancel import CancelToken, Progress, ProgressFn, no_progress
from bisect_tui.core.session import stable_key
from bisect_tui.api import DISABLED_KEY, EngineConfig, FusedNode


def parted_region(region: str, parts: Optional[int]) -> str:
    """The region a step shows: "whole graph, in 3 parts" for a build made as parts (parts.py)."""
    return f"{region}, in {parts} parts" if parts else region


@dataclass
class Candidate:
    """One build a search round asks for (see `Trials.evaluate_many`)."""

    kind: str
    enabled: Optional[list[Unit]]
    config: Optional[EngineConfig] = None
    held: Optional[list[Unit]] = None
    marks: Optional[list[str]] = None


class BuildBudgetExceeded(Exception):
    def __init__(self, n: int):
        super().__init__(f"stopped after {n} engine builds (--max-builds)")


def _elementwise(j) -> Optional[float]:
    from bisect_tui.core.bisect.judge import elementwise_ratio

    r = elementwise_ratio(j)
    return None if r is None else finite(r)


def finite(x: float) -> float:
    """A ratio or error as JSON can hold it (an infinite ratio: a failed build)."""
    try:
        return float(x) if math.isfinite(x) else (1e300 if x > 0 else -1e300)
    except TypeError:
        return float("nan")


class Trials:
    """Trials judged for one engine config: handed a store, a scheduler and a judge.

    `index`: the model's graph (its tensors are what marking blocks, its order
    what the units follow); `search_key`: what makes two searches' steps the
    same (baseline, tolerance, config)."""

    def __init__(self, store: MemoryStore, scheduler: BuildScheduler, judge: TrialJudge, *,
                 config: EngineConfig, index, search_key: str, max_builds: int = 200,
                 progress: ProgressFn = no_progress, cancel: Optional[CancelToken] = None):
        self.store = store
        self.scheduler = scheduler
        self.trial_judge = judge
        self.config = config
        self.index = index
        self.search_key = search_key
        self.max_builds = max_builds
        self.progress = progress
        self.cancel = cancel or CancelToken()
        self.builds = 0
        self.subgraph_builds = 0  # engine builds of extracted subgraphs standing for whole-graph ones
        self.expected_builds = 0
        self.round_seconds: list[float] = []
        self._all_tensors = index.intermediate_tensors()
        self._maps: dict[str, tuple] = {}  # step key -> (fused nodes, optimized graph) read this run
        self._units: dict[str, tuple] = {}  # step key -> (that map, its units)
        self._no_subgraph: set[str] = set()  # suspects whose subgraph cannot stand for the whole graph
        self.blocked: Optional[Step] = None  # this search's "all fusions blocked" (a later round adopts it)

    @property
    def steps(self) -> list[Step]:
        return self.store.steps

    @property
    def untrusted_steps(self) -> int:
        return self.store.untrusted

    # --- one round ---------------------------------------------------------------
    def evaluate(self, kind: str, enabled: Optional[list[Unit]], config: Optional[EngineConfig] = None,
                 held: Optional[list[Unit]] = None, marks: Optional[list[str]] = None) -> Step:
        """Build the engine with only `enabled` units free to fuse and judge it.

        enabled=None means no marking at all (the plain engine)."""
        return self.evaluate_many([Candidate(kind, enabled, config, held, marks)])[0]

    def evaluate_many(self, cands: list[Candidate]) -> list[Step]:
        """One round: every candidate judged, builds spread over the pool.

        Steps are recorded in the order given and each build counted in that
        order, so the steps file, the verdicts and the build count are the
        same with one worker or many."""
        plans = [self.plan(c) for c in cands]
        out: list[Optional[Step]] = [None] * len(plans)
        todo: list[int] = []
        for i, p in enumerate(plans):
            known = self.known_step(p)
            if known is not None:
                out[i] = known
                continue
            if any(plans[j].key == p.key for j in todo):
                continue  # the same build twice in one round: built once, filled in below
            todo.append(i)
        if todo:
            self.cancel.check()
            budget = self.max_builds - self.builds
            over = len(todo) > budget
            todo = todo[: max(budget, 0)]
            if todo:
                self._build_round([plans[i] for i in todo], todo, out)
            if over:
                raise BuildBudgetExceeded(self.max_builds)
        for i, p in enumerate(plans):
            if out[i] is None:
                out[i] = self.store.done(p.key)
        return out  # type: ignore[return-value]

    def known_step(self, p: Plan) -> Optional[Step]:
        """The verdict already had: this run's step (asked twice, e.g. attribution,
        then workaround) or an earlier run's record, replayed as a step now."""
        done = self.store.done(p.key)
        if done is not None:
            return done
        rec = self.store.recorded(p.key)
        if rec is None:
            return None
        step = Step.from_json(rec, n=self.store.next_n, kind=p.kind, region=parted_region(p.region, rec.get("parts")),
                              enabled=list(p.ids),
                              cached=True, builds=self.builds)
        self._report(self.store.add(step))
        return step

    def plan(self, c: Candidate) -> Plan:
        config = c.config or self.config
        marks = c.marks
        if marks is None:
            if c.enabled is None:
                marks = []
            else:
                held_t = [t for u in (c.held or []) for t in u.interior]
                marks = marks_for(c.enabled, self._all_tensors, held_t)
        digest = hashlib.sha1("\n".join(sorted(marks)).encode()).hexdigest()
        key = stable_key(self.search_key, config.to_dict(), digest)
        region = "whole graph" if c.enabled is None else region_text(c.enabled)
        ids = () if c.enabled is None else tuple(u.index for u in c.enabled)
        return Plan(c.kind, config, tuple(marks), key, region, ids)

    def prefetch(self, cand: Candidate, guess: bool = False) -> None:
        """Start a build the search will certainly ask for next (or, `guess`, may ask
        for: next_round.py), beside the work before it (scheduler.prefetch);
        evaluate_many takes its result when the candidate comes."""
        if not self.scheduler.can_prefetch(3 if guess else 2):
            return
        plan = self.plan(cand)
        if self.scheduler.prefetching(plan.key) or self.store.recorded(plan.key) or self.store.done(plan.key):
            return
        self.scheduler.prefetch(plan, guess)

    def _build_round(self, plans: list[Plan], todo: list[int], out: list) -> None:
        first = plans[0]
        what = (f"{first.kind}: {first.region}" if len(plans) == 1 else
                f"{len(plans)} candidates at once ({min(len(plans), self.scheduler.workers)} worker(s))")
        self.progress(Progress(
            "bisect", f"step {self.store.next_n}: building {what}",
            self.builds, max(self.expected_builds, self.builds + len(plans)),
            {"building": {"n": self.store.next_n, "kind": first.kind, "region": first.region,
                          "enabled": list(first.ids), "candidates": len(plans)}},
        ))
        t0 = time.perf_counter()
        built = self.scheduler.build(plans)
        wall = time.perf_counter() - t0
        for i, p, (job, res) in zip(todo, plans, built):
            j = self.trial_judge.judge_trial(p, res)
            fused_count, optimized = None, None
            if job.workdir is not None and res.fused_nodes is not None:
                fused_objs = res.fused_objs or [FusedNode.from_dict(d) for d in res.fused_nodes]
                fused_count = sum(1 for f in fused_objs if f.is_fused)
                atomic.write_json(Path(job.workdir) / "fused_nodes.json", res.fused_nodes, compact=True)
                optimized = res.optimized
                self._maps[p.key] = (fused_objs, optimized)  # fused_map reads no file back this run
            self.builds += 1
            step = Step(
                n=self.store.next_n, kind=p.kind, region=parted_region(p.region, res.parts),
                enabled=list(p.ids),
                config=step_config(p.config), marks=len(p.marks), passed=j.passed, ratio=finite(j.ratio),
                max_abs=finite(j.max_abs), summary=j.summary, elementwise_ratio=_elementwise(j), builds=self.builds, cached=False,
                seconds=res.seconds, fused_in_build=fused_count, key=p.key,
                optimized=optimized, error_kind=res.error_kind, error=res.error, unblocked=res.unblocked,
                worker=res.worker, round_size=len(plans) if len(plans) > 1 else None,
                parts=res.parts or None,
            )
            self.record(step)
            out[i] = step
        self.round_seconds.append(wall)

    def record(self, step: Step) -> None:
        """A step judged now: this run's, on record for the next, and reported."""
        self.store.add(step)
        self.store.save(step.to_json())
        self._report(step)

    def _report(self, step: Step) -> None:
        verdict = "pass" if step.passed else "FAIL"
        self.progress(Progress(
            "bisect",
            f"step {step.n}: {step.region} -> {verdict} (x{step.ratio:.3g} of tolerance)",
            self.builds, max(self.expected_builds, self.builds),
            {"step": step.to_json()},
        ))

    # --- a trial on a subgraph -------------------------------------------------------
    def subgraph_step(self, u: Unit, check: Callable[[], Optional[dict]]) -> Optional[Step]:
        """`u` alone, judged on its own subgraph by `check` (subgraph_check.py;
        None where the subgraph cannot stand for the whole graph)."""
        key = stable_key(self.search_key, "subgraph/v1", self.config.to_dict(), sorted(u.original_nodes))
        plan = Plan("suspect alone, on its subgraph", self.config, (), key, region_text([u]), (u.index,))
        known = self.known_step(plan)
        if known is not None:
            return known
        if key in self._no_subgraph:
            return None
        self.cancel.check()
        self.progress(Progress("bisect", f"step {self.store.next_n}: suspect {plan.region} on its subgraph",
                               self.builds, max(self.expected_builds, self.builds)))
        res = check()
        if res is None:
            self._no_subgraph.add(key)
            return None
        j: Judgement = res["judgement"]
        self.subgraph_builds += 1
        step = Step(
            n=self.store.next_n, kind=plan.kind, region=plan.region, enabled=[u.index],
            config=step_config(self.config), marks=0, passed=j.passed, ratio=finite(j.ratio),
            max_abs=finite(j.max_abs), summary=j.summary, elementwise_ratio=_elementwise(j), builds=self.builds, cached=False,
            seconds=res["seconds"], key=key, worker="main", subgraph=True,
        )
        self.record(step)
        return step

    # --- the engine's map -----------------------------------------------------------------
    def map_kind(self, config: EngineConfig) -> str:
        extra = sorted(set(config.disabled_passes) - set(self.config.disabled_passes))
        return f"disable {', '.join(extra)}" if extra else f"engine {config.level}"

    def engine_dir(self, config: EngineConfig) -> Path:
        return self.scheduler.engine_dir(config)

    def fused_map(self, config: EngineConfig) -> tuple[Optional[list[FusedNode]], Optional[str], Step]:
        """The unmarked engine of `config`: its fused-node map and optimized graph
        (one build, or none when an earlier step or run made it)."""
        step = self.evaluate(self.map_kind(config), None, config)
        workdir = self.engine_dir(config)
        path = workdir / "fused_nodes.json"
        known = self._maps.get(step.key)
        if known is not None and step.optimized == known[1] and self.store.trusted_file(step.optimized):
            return known[0], step.optimized, step  # read once per run: the attribution and the rest proof ask again
        if step.optimized and path.exists() and self.store.trusted_file(step.optimized):
            fused = [FusedNode.from_dict(d) for d in safepath.read_json(workdir, "fused_nodes.json")]
            self._maps[step.key] = (fused, step.optimized)
            return fused, step.optimized, step
        if step.error_kind:
            return None, None, step
        # The verdict was recorded but its files are gone (deleted, or an older
        # session): rebuild the engine once to read its map.
        self.cancel.check()
        fused, optimized = self.rebuild_map(config, workdir)
        self.builds += 1
        step = self.store.replace(step, step.replace(optimized=optimized))
        atomic.write_json(path, [f.to_dict() for f in fused])
        record = {**(self.store.recorded(step.key) or step.to_json()), "optimized": step.optimized}
        self.store.save(record)
        return fused, step.optimized, step

    def rebuild_map(self, config: EngineConfig, workdir: Path) -> tuple[list[FusedNode], str]:
        """Build the unmarked engine only to read its map (the engine's; see search.Bisector)."""
        raise RuntimeError("no engine to rebuild the fused-node map with")

    def prefetch_maps(self, configs: list[EngineConfig]) -> None:
        """Build the unmarked engines of several configs in one round (the
        attribution's one rebuild per candidate pass): `fused_map` then reads them."""
        if len(configs) > 1:
            self.evaluate_many([Candidate(self.map_kind(c), None, c) for c in configs])

    def units_at(self, level: str) -> tuple[list[Unit], Optional[str]]:
        fused, opt, step = self.fused_map(self.config.with_level(level))
        if fused is None:
            raise RuntimeError(f"the {level} engine could not be built: {step.summary}")
        known = self._units.get(step.key)
        if known is None or known[0] is not fused:  # the same map: the same units (asked twice a search)
            known = self._units[step.key] = (fused, build_units(fused, self.index))
        return list(known[1]), opt

    def known_units(self, config: EngineConfig) -> Optional[list[Unit]]:
        """The units of the unmarked engine of `config` when this run already mapped
        it (no build: where a marked build of it may be cut, parts.cuts_for)."""
        known = self._units.get(stable_key(self.search_key, config.to_dict(), hashlib.sha1(b"").hexdigest()))
        return known[1] if known is not None else None

    # --- verdicts made elsewhere ------------------------------------------------------------
    def full_engine_key(self) -> str:
        return stable_key(self.search_key, self.config.to_dict(), hashlib.sha1(b"").hexdigest())

    def seed_full_engine(self, check: Optional[dict], check_map=None) -> None:
        """`check` already built and judged the full engine with the same
        inputs and tolerance: record it as the search's first step.

        `check_map`: the check's (optimized graph, config, fused nodes), in memory."""
        if not check or EngineConfig.from_dict(check["config"]) != self.config:
            return
        key = self.full_engine_key()
        if self.store.recorded(key) or not self.store.trusted_file(check.get("optimized_model")):
            return
        worst = max(check["outputs"].values(), key=lambda o: o["verdict"]["ratio"])
        rec = Step(
            n=0, kind="full engine", region="whole graph", enabled=[], config=step_config(self.config),
            marks=0, passed=check["passed"], ratio=finite(worst["verdict"]["ratio"]),
            max_abs=finite(worst["metrics"]["max_abs"]),
            summary="PASS" if check["passed"] else worst["summary"], builds=0, cached=True,
            seconds=check.get("build_seconds", 0.0), fused_in_build=len(check["fused_nodes"]), key=key,
            optimized=check["optimized_model"],
            elementwise_ratio=_elementwise(SimpleNamespace(outputs=check["outputs"])),
        ).to_json()
        self.store.save(rec, **{"from": "check.json"})
        if check_map and check_map[0] == check["optimized_model"] and check_map[1] == self.config:
            self._maps[key] = (check_map[2], check_map[0])  # the check's map, in memory: not read back

    def has_step(self, config: EngineConfig) -> bool:
        """The unmarked build of `config` is on record or being built (no new build)."""
        key = self.plan(Candidate("workaround", None, config)).key
        return bool(self.store.done(key) or self.store.recorded(key) or self.scheduler.prefetching(key))

    def culprit_kept_for(self, groups: list, name: str) -> Optional[dict]:
        """attribute_subgraph.culprit_kept for this search (find_workaround asks)."""
        from bisect_tui.core.bisect.attribute_subgraph import culprit_kept

        return culprit_kept(self, groups, name)

    def workaround_kept(self, name: str) -> bool:
        """The user's engine with only `name` disabled keeps a culprit of the first round
        (attribute_subgraph.culprit_kept): the workaround will not build it, so a later
        round does not prefetch it either."""
        from bisect_tui.core.bisect.attribute_subgraph import culprit_kept, culprits_of_search

        first = getattr(self, "_earlier", None)
        if first is None:
            return False
        return culprit_kept(first, culprits_of_search(first), name) is not None

    def follow(self, earlier: "Trials") -> None:
        """This search is the next fixpoint round of `earlier`: one store of verdicts and
        one set of maps for both, so a build either round made is not made again (the
        steps of each stay its own)."""
        self._earlier = getattr(earlier, "_earlier", None) or earlier
        self.store.records = earlier.store.records
        self.scheduler = earlier.scheduler  # a build prefetched in this round for the next (the workaround's)
        self._maps = earlier._maps
        self._units = earlier._units
        self._no_subgraph = earlier._no_subgraph
        if earlier.blocked is not None and earlier.blocked.passed:
            self.adopt_blocked(earlier.blocked)

    def blocked_plan(self) -> Plan:
        return self.plan(Candidate("all fusions blocked", None, marks=list(self._all_tensors)))

    def adopt_blocked(self, step: Step) -> None:
        """The earlier round's "all fusions blocked", passed, stands for this round's: its
        engine only has more passes disabled, and with every tensor marked the passes
        left could only rewrite where the earlier engine's already could, which marking
        blocked (the reason this round exists is a pass that fuses the same nodes once
        the first is off: blocked in both). The step is shown as reused, not counted."""
        key = self.blocked_plan().key
        if self.store.recorded(key) or not step.passed:
            return
        self.store.remember(key, {**step.to_json(), "key": key, "kind": "all fusions blocked"})

    def adopt_full_engine(self, step: Step) -> None:
        """Another search already built and judged this search's full engine
        (the fixpoint's check with the found passes disabled): reuse it."""
        key = self.full_engine_key()
        if self.store.recorded(key) or step.config.get(DISABLED_KEY) != list(self.config.disabled_passes):
            return
        self.store.remember(key, {**step.to_json(), "key": key, "kind": "full engine"})
