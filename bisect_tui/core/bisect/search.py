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
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable, Optional


from bisect_tui.core import atomic, safepath
from bisect_tui.core.bisect import early
from bisect_tui.core.bisect.judge import Judgement, OutputJudge
from bisect_tui.core.bisect.units import Unit, build_units, marks_for, region_text
from bisect_tui.core.cancel import Progress
from bisect_tui.core.errors import UserError
from bisect_tui.core.session import now_iso, stable_key
from bisect_tui.api import LEVELS, EngineConfig, FusedNode

MAX_SEED_TRIES = 3


def record_digest(rec: dict) -> str:
    """SHA-256 of a step record (without its own digest), written with it."""
    body = {k: v for k, v in rec.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Step:
    n: int
    kind: str
    region: str
    enabled: list[int]
    config: dict
    marks: int
    passed: bool
    ratio: float
    max_abs: float
    summary: str
    builds: int
    cached: bool
    seconds: float
    fused_in_build: Optional[int] = None
    key: str = ""
    optimized: Optional[str] = None  # saved optimized graph (unmarked builds only)
    error_kind: Optional[str] = None  # build_error | run_error: the engine failed, not the numbers
    error: Optional[str] = None  # the engine's own message
    # fused nodes the engine kept although a tensor inside them was marked
    # (engines whose marking does not always block; None when not asked)
    unblocked: Optional[list[str]] = None
    worker: Optional[str] = None  # which process built it: "main" or "w<pid>"
    round_size: Optional[int] = None  # builds of the round it was built in, when more than one
    # judged on the fused node's own subgraph, the rest of the graph unfused
    # (subgraph_check.py): an engine build of a few nodes, not a whole-graph build
    subgraph: Optional[bool] = None

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        for k in ("unblocked", "worker", "round_size", "subgraph"):
            if d.get(k) is None:
                d.pop(k, None)
        return d


@dataclass
class Candidate:
    """One build a search round asks for (see `Bisector.evaluate`)."""

    kind: str
    enabled: Optional[list[Unit]]
    config: Optional[EngineConfig] = None
    held: Optional[list[Unit]] = None
    marks: Optional[list[str]] = None


@dataclass
class SearchState:
    level: str
    units: list[Unit]
    culprits: list[list[int]] = field(default_factory=list)  # unit indices per culprit (set)
    verdict: str = "running"  # pass | culprits | not_fusion | no_culprit | running | cancelled


class Bisector:
    """Runs the search for one Triage (baseline done) and one engine config."""

    def __init__(self, triage, config: Optional[EngineConfig] = None, max_builds: int = 200,
                 max_culprits: int = 5, local_factor: float = 10.0, fanout: int = 1, pool=None):
        """`fanout`: candidates per round of the prefix search (1: binary search;
        k: k split points per round, about log_(k+1) n rounds of k builds). It is
        the strategy, so it alone decides the builds; `pool` only decides how many
        run at once (default: one at a time, in this process)."""
        from bisect_tui.core.bisect.pool import pool_for

        self.local_factor = local_factor
        self.fanout = max(1, int(fanout))
        self.round_seconds: list[float] = []
        self.t = triage
        self.config = config or triage.opts.config
        self.max_builds = max_builds
        self.max_culprits = max_culprits
        self.session = triage.session
        self.engine = triage.engine
        self.pool = pool if pool is not None else pool_for(triage, 1)
        self.dir = self.session.bisect_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.steps: list[Step] = []
        self.builds = 0
        self.subgraph_builds = 0  # engine builds of extracted subgraphs standing for whole-graph ones
        self._no_subgraph: set[str] = set()  # suspects whose subgraph cannot stand for the whole graph
        self.expected_builds = 0
        self._cache: dict[str, dict] = {}
        self._all_tensors = triage.info.index.intermediate_tensors()
        self._load_cache()
        self.judge = OutputJudge.for_triage(triage)
        self._seed_from_check = triage.fused
        self._prefetched: dict[str, "object"] = {}  # step key -> Future of [BuildResult] (prefetch)
        self._maps: dict[str, tuple] = {}  # step key -> (fused nodes, optimized graph) read this run
        self._units: dict[str, tuple] = {}  # step key -> (that map, its units)
        # isolation and attribution per culprit (findings.py), set by run.py: lets the
        # attribution's confirming build stand for "remaining fusions"
        self.findings = None
        self.search_key = stable_key(
            "bisect/v1", triage.baseline.manifest["key"], self.config.to_dict(),
            triage.opts.tolerance.to_dict(), triage.opts.topk,
        )

    # --- persistence -----------------------------------------------------------
    @property
    def steps_path(self):
        return self.dir / "steps.jsonl"

    def _load_cache(self) -> None:
        """Steps of earlier runs, each trusted only when its digest matches (a
        hand-edited or damaged line is recomputed, and the count is reported)."""
        self.untrusted_steps = 0
        if not self.steps_path.exists() and not self.steps_path.is_symlink():
            return
        with safepath.open_read(self.session.root, "bisect/steps.jsonl", binary=False) as fh:
            text = fh.read()
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn last line from an interrupted write
            if not isinstance(rec, dict) or not isinstance(rec.get("key"), str):
                continue
            if rec.get("digest") != record_digest(rec):
                self.untrusted_steps += 1
                continue
            self._cache[rec["key"]] = rec
        if self.untrusted_steps:
            self.t.progress(Progress("bisect", f"{self.untrusted_steps} saved step(s) failed their digest "
                                     "check and will be recomputed"))

    def _append(self, rec: dict) -> None:
        rec = {k: v for k, v in rec.items() if k != "digest"}
        rec["digest"] = record_digest(rec)
        line = atomic.to_json(rec, compact=True) + "\n"
        with safepath.open_append(self.session.root, "bisect/steps.jsonl") as fh:
            fh.write(line)
            fh.flush()

    def trusted_file(self, path: Optional[str]) -> Optional[str]:
        """A path read back from a session file, kept only if it is a regular file
        inside the session (never a link, never outside)."""
        if not path:
            return None
        try:
            p = self.session.contains(Path(path))
        except UserError:
            return None
        return str(p) if safepath.regular_file(p) else None

    # --- one test ----------------------------------------------------------------
    def evaluate(
        self,
        kind: str,
        enabled: Optional[list[Unit]],
        config: Optional[EngineConfig] = None,
        held: Optional[list[Unit]] = None,
        marks: Optional[list[str]] = None,
    ) -> Step:
        """Build the engine with only `enabled` units free to fuse and judge it.

        enabled=None means no marking at all (the plain engine)."""
        return self.evaluate_many([Candidate(kind, enabled, config, held, marks)])[0]

    def evaluate_many(self, cands: list["Candidate"]) -> list[Step]:
        """One round: every candidate judged, builds spread over the pool.

        Steps are recorded in the order given and each build counted in that
        order, so the steps file, the verdicts and the build count are the
        same with one worker or many."""
        plans = [self._plan(c) for c in cands]
        out: list[Optional[Step]] = [None] * len(plans)
        todo: list[int] = []
        for i, (kind, config, marks, key, region, ids) in enumerate(plans):
            done = next((st for st in self.steps if st.key == key), None)
            if done is not None:  # asked twice in this run (e.g. attribution, then workaround)
                out[i] = done
                continue
            cached = self._cache.get(key)
            if cached is not None:
                known = {k: v for k, v in cached.items() if k in Step.__dataclass_fields__}
                step = Step(**{**known, "n": len(self.steps) + 1, "kind": kind, "region": region,
                               "enabled": ids, "cached": True, "builds": self.builds})
                self.steps.append(step)
                self._report(step)
                out[i] = step
                continue
            if any(plans[j][3] == key for j in todo):
                continue  # the same build twice in one round: built once, filled in below
            todo.append(i)
        if todo:
            self.t.cancel.check()
            budget = self.max_builds - self.builds
            over = len(todo) > budget
            todo = todo[: max(budget, 0)]
            if todo:
                self._build_round(plans, todo, out)
            if over:
                raise BuildBudgetExceeded(self.max_builds)
        for i, p in enumerate(plans):
            if out[i] is None:
                out[i] = next(st for st in self.steps if st.key == p[3])
        return out  # type: ignore[return-value]

    def _plan(self, c: "Candidate") -> tuple:
        """(kind, config, marks, key, region, unit ids) of one candidate."""
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
        ids = [] if c.enabled is None else [u.index for u in c.enabled]
        return (c.kind, config, list(marks), key, region, ids)

    def _job(self, plan: tuple):
        from bisect_tui.core.bisect.pool import BuildJob

        kind, config, marks, key, region, ids = plan
        # Unmarked builds are the real engine for a config: keep their optimized
        # graph and fused-node map, which the level search, the attribution and
        # the workaround all read instead of building again.
        workdir = self.engine_dir(config) if not marks else None
        return BuildJob(config=config.to_dict(), marks=tuple(marks),
                        workdir=str(workdir) if workdir is not None else None,
                        want_unblocked=bool(marks) and not self._marking_blocks,
                        outputs=tuple(self.t.info.outputs))

    def can_prefetch(self) -> bool:
        caps = getattr(self.engine, "capabilities", None)
        return (bool(getattr(caps, "concurrent_builds", False)) and self.fanout == 1
                and getattr(self.pool, "kind", None) in ("serial", "processes"))

    def prefetch(self, cand: "Candidate") -> None:
        """Start a build the search will certainly ask for next, in a thread beside
        the work before it (an engine with Capabilities.concurrent_builds, and
        --fanout 1, whose rounds are one build each: with more, the rounds spread
        builds over the workers already; not on Ray). evaluate_many takes
        its result when the candidate comes, so the steps, their order and the
        build count are those of the plain search; a prefetch nobody takes (the
        search cancelled or failed first) is closed and not counted."""
        if not self.can_prefetch():
            return
        plan = self._plan(cand)
        key = plan[3]
        if key in self._prefetched or key in self._cache or any(st.key == key for st in self.steps):
            return
        started = early.take(self.t, plan[1], plan[2])  # made while the check ran (early.py)
        if started is not None:
            self._prefetched[key] = started
            return
        from bisect_tui.core import background

        self._prefetched[key] = background.start(self.pool.run, [self._job(plan)], name="prefetch-build")

    def _build_round(self, plans: list, todo: list[int], out: list) -> None:
        jobs = [self._job(plans[i]) for i in todo]
        first = plans[todo[0]]
        what = (f"{first[0]}: {first[4]}" if len(todo) == 1 else
                f"{len(todo)} candidates at once ({min(len(todo), self.pool.workers)} worker(s))")
        self.t.progress(Progress(
            "bisect", f"step {len(self.steps) + 1}: building {what}",
            self.builds, max(self.expected_builds, self.builds + len(todo)),
            {"building": {"n": len(self.steps) + 1, "kind": first[0], "region": first[4], "enabled": first[5],
                          "candidates": len(todo)}},
        ))
        t0 = time.perf_counter()
        started = [self._prefetched.pop(plans[i][3], None) or early.take(self.t, plans[i][1], plans[i][2])
                   for i in todo]
        rest = iter(self.pool.run([j for j, f in zip(jobs, started) if f is None]) if None in started else ())
        results = [f.result()[0] if f is not None else next(rest) for f in started]
        wall = time.perf_counter() - t0
        for i, job, res in zip(todo, jobs, results):
            kind, config, marks, key, region, ids = plans[i]
            fused_count = None
            optimized = None
            if res.failed_at == "build":
                # An engine that cannot even be built with this region enabled is
                # broken by it: the step fails, and the message says why.
                j = Judgement(False, math.inf, None, math.nan, f"engine build failed: {res.build_message}", {})
            elif res.outputs is None:
                j = Judgement(False, math.inf, None, math.nan, f"engine run failed: {res.error}", {})
            else:
                j = self.judge.judge(res.outputs)
            if job.workdir is not None and res.fused_nodes is not None:
                from pathlib import Path as _P

                fused_objs = res.fused_objs or [FusedNode.from_dict(d) for d in res.fused_nodes]
                fused_count = sum(1 for f in fused_objs if f.is_fused)
                atomic.write_json(_P(job.workdir) / "fused_nodes.json", res.fused_nodes, compact=True)
                optimized = res.optimized
                self._maps[key] = (fused_objs, optimized)  # fused_map reads no file back this run
            self.builds += 1
            step = Step(
                n=len(self.steps) + 1, kind=kind, region=region, enabled=ids,
                config={"level": config.level, "disabled_optimizers": list(config.disabled_passes)},
                marks=len(marks), passed=j.passed, ratio=_finite(j.ratio), max_abs=_finite(j.max_abs),
                summary=j.summary, builds=self.builds, cached=False,
                seconds=res.seconds, fused_in_build=fused_count, key=key,
                optimized=optimized, error_kind=res.error_kind, error=res.error, unblocked=res.unblocked,
                worker=res.worker, round_size=len(todo) if len(todo) > 1 else None,
            )
            self.steps.append(step)
            self._append({**step.to_dict(), "at": now_iso()})
            self._cache[key] = step.to_dict()
            self._report(step)
            out[i] = step
        self.round_seconds.append(wall)

    def _report(self, step: Step) -> None:
        verdict = "pass" if step.passed else "FAIL"
        self.t.progress(Progress(
            "bisect",
            f"step {step.n}: {step.region} -> {verdict} (x{step.ratio:.3g} of tolerance)",
            self.builds, max(self.expected_builds, self.builds),
            {"step": step.to_dict()},
        ))

    # --- the search ----------------------------------------------------------------
    @property
    def _keepset(self) -> bool:
        caps = getattr(self.engine, "capabilities", None)
        return caps is None or caps.keep_high_precision

    @property
    def _marking_blocks(self) -> bool:
        caps = getattr(self.engine, "capabilities", None)
        return caps is None or caps.marking_blocks

    @property
    def levels(self) -> tuple[str, ...]:
        """The engine's optimization levels, lowest (everything off) first."""
        return engine_levels(self.engine)

    def find_level(self) -> tuple[str, Step]:
        """Lowest optimization level (up to the user's) whose engine fails."""
        levels = self.levels
        top = levels.index(self.config.level)
        last = None
        for lvl in levels[1 : top + 1]:
            cfg = self.config.with_level(lvl)
            step = self.evaluate(f"level {lvl}", None, cfg)
            last = (lvl, step)
            if not step.passed:
                return lvl, step
        assert last is not None
        return last

    def engine_dir(self, config: EngineConfig):
        d = self.t.engine_dir(config)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def fused_map(self, config: EngineConfig) -> tuple[Optional[list[FusedNode]], Optional[str], Step]:
        """The unmarked engine of `config`: its fused-node map and optimized graph
        (one build, or none when an earlier step or run made it)."""
        step = self.evaluate(self._map_kind(config), None, config)
        workdir = self.engine_dir(config)
        path = workdir / "fused_nodes.json"
        known = self._maps.get(step.key)
        if known is not None and step.optimized == known[1] and self.trusted_file(step.optimized):
            return known[0], step.optimized, step  # read once per run: the attribution and the rest proof ask again
        if step.optimized and path.exists() and self.trusted_file(step.optimized):
            fused = [FusedNode.from_dict(d) for d in safepath.read_json(workdir, "fused_nodes.json")]
            self._maps[step.key] = (fused, step.optimized)
            return fused, step.optimized, step
        if step.error_kind:
            return None, None, step
        # The verdict was recorded but its files are gone (deleted, or an older
        # session): rebuild the engine once to read its map.
        self.t.cancel.check()
        built = self.engine.build(self.session.model_path, config, (), workdir)
        self.builds += 1
        try:
            fused = built.fused_nodes
            step.optimized = str(built.optimized_model_path)
        finally:
            built.close()
        atomic.write_json(path, [f.to_dict() for f in fused])
        record = {**self._cache.get(step.key, step.to_dict()), "optimized": step.optimized}
        self._cache[step.key] = record
        self._append({**record, "at": now_iso()})  # the later line for a key wins on resume
        return fused, step.optimized, step

    def _map_kind(self, config: EngineConfig) -> str:
        extra = sorted(set(config.disabled_passes) - set(self.config.disabled_passes))
        return f"disable {', '.join(extra)}" if extra else f"engine {config.level}"

    def prefetch_maps(self, configs: list[EngineConfig]) -> None:
        """Build the unmarked engines of several configs in one round (the
        attribution's one rebuild per candidate pass): `fused_map` then reads them."""
        if len(configs) > 1:
            self.evaluate_many([Candidate(self._map_kind(c), None, c) for c in configs])

    def units_at(self, level: str) -> tuple[list[Unit], Optional[str]]:
        fused, opt, step = self.fused_map(self.config.with_level(level))
        if fused is None:
            raise RuntimeError(f"the {level} engine could not be built: {step.summary}")
        known = self._units.get(step.key)
        if known is None or known[0] is not fused:  # the same map: the same units (asked twice a search)
            known = self._units[step.key] = (fused, build_units(fused, self.t.info.index))
        return list(known[1]), opt

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
            steps = self.suspects_alone(batch, held)
            for s, step in zip(batch, steps):
                if not step.passed:
                    return [s]
        k = self.prefix_search(remaining, held, [])
        if k is None:
            return None
        culprit = remaining[k]
        step = self.evaluate("culprit alone", [culprit], held=held)
        if not step.passed:
            return [culprit]
        # An interaction: the culprit needs earlier fusions to fail.
        fixed = [culprit]
        cands = remaining[:k]
        while cands:
            j = self.prefix_search(cands, held, fixed)
            if j is None:
                break
            fixed = [cands[j]] + fixed
            step = self.evaluate("interaction", fixed, held=held)
            if not step.passed:
                return sorted(fixed, key=lambda u: u.index)
            cands = cands[:j]
        return sorted(fixed, key=lambda u: u.index)

    def _seed_full_engine(self) -> None:
        """`check` already built and judged the full engine with the same
        inputs and tolerance: record it as the search's first step."""
        fused = self._seed_from_check
        if not fused or EngineConfig.from_dict(fused["config"]) != self.config:
            return
        key = stable_key(self.search_key, self.config.to_dict(), hashlib.sha1(b"").hexdigest())
        if key in self._cache or not self.trusted_file(fused.get("optimized_model")):
            return
        outs = fused["outputs"].values()
        worst = max(outs, key=lambda o: o["verdict"]["ratio"])
        self._cache[key] = Step(
            n=0, kind="full engine", region="whole graph", enabled=[],
            config={"level": self.config.level, "disabled_optimizers": list(self.config.disabled_passes)},
            marks=0, passed=fused["passed"], ratio=_finite(worst["verdict"]["ratio"]),
            max_abs=_finite(worst["metrics"]["max_abs"]),
            summary="PASS" if fused["passed"] else worst["summary"], builds=0, cached=True,
            seconds=fused.get("build_seconds", 0.0), fused_in_build=len(fused["fused_nodes"]), key=key,
            optimized=fused["optimized_model"],
        ).to_dict()
        self._append({**self._cache[key], "at": now_iso(), "from": "check.json"})
        made = getattr(self.t, "fused_map_objs", None)
        if made and made[0] == fused["optimized_model"] and made[1] == self.config:
            self._maps[key] = (made[2], made[0])  # the check's map, in memory: not read back from its file

    def adopt_full_engine(self, step: Step) -> None:
        """Another search already built and judged this search's full engine
        (the fixpoint's check with the found passes disabled): reuse it."""
        key = stable_key(self.search_key, self.config.to_dict(), hashlib.sha1(b"").hexdigest())
        if key in self._cache or step.config.get("disabled_optimizers") != list(self.config.disabled_passes):
            return
        self._cache[key] = {**step.to_dict(), "key": key, "kind": "full engine"}

    def run(self, probe_fn: Optional[Callable] = None) -> dict:
        """Search; returns the JSON-able search result (culprits as unit indices)."""
        t0 = time.perf_counter()
        result: dict = {"started": now_iso(), "config": self.config.to_dict()}
        self._seed_full_engine()
        full = self.evaluate("full engine", None)
        result["full_engine"] = full.to_dict()
        if full.error_kind:
            result["engine_error"] = {"kind": full.error_kind, "message": full.error}
        if full.passed:
            result.update(verdict="pass", culprits=[], units=[], level=self.config.level)
            return self._finish(result, t0)
        confirmed: Optional[Unit] = None
        # in an amplifying model the lowest failing level only shows amplified reordering:
        # every fusion of the user's level is judged locally instead
        users_level = not tries_suspect_first(self.engine, self.config, self.t.fused)
        blocked_cand = Candidate("all fusions blocked", None, marks=list(self._all_tensors))
        if not users_level and probe_fn:
            # the probe of the user's own engine (the check built it) and its suspect on
            # its subgraph: no whole-graph build yet, but the blocked build comes next
            # whatever the suspect does: it is built meanwhile
            self.prefetch(blocked_cand)
            confirmed = self._suspect_at_user_level(probe_fn)
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
                first += [Candidate(self._map_kind(c), None, c) for c in spec]
            else:
                at_user, _ = self.units_at(self.config.level)
                rest = [u for u in at_user if u.blockable and u != confirmed]
                if rest:
                    first.append(Candidate("remaining fusions", rest, held=[confirmed]))
        blocked = self.evaluate_many(first)[0]
        result["all_blocked"] = blocked.to_dict()
        if users_level or confirmed is not None:
            level = self.config.level
        else:
            level = self.find_level()[0]
        result["level"] = level
        try:
            units, optimized = self.units_at(level)
        except RuntimeError:
            # the failing engine has no optimized graph to map; the engine with
            # every fusion blocked is the reference the region search needs
            units, optimized = [], None
        result["units"] = [u.to_dict() for u in units]
        result["optimized_model"] = optimized
        if not blocked.passed and blocked.unblocked and units and self.config.precision != "fp32":
            # reduced precision: when the same engine in FP32 passes, the error is the precision's,
            # whatever fusions survived the marking
            fp32 = self.evaluate("full engine in FP32", None, self.config.with_precision("fp32"))
            result["fp32_engine"] = fp32.to_dict()
            blocked_unblocked = None if fp32.passed else blocked.unblocked
        else:
            blocked_unblocked = blocked.unblocked
        if not blocked.passed and blocked_unblocked and units:
            # marking is not this engine's switch for these fusions: judge each
            # region alone, through the engine, on the baseline's own tensors
            return self._finish(self._isolated_verdict(result, units, self.config.with_level(level),
                                                       blocked_unblocked), t0)
        if not blocked.passed:
            result.update(
                verdict="not_fusion", culprits=[],
                unblockable=[u.index for u in units if not u.blockable],
                explanation=(
                    "the error stays with every fusion blocked (all tensors marked): it does not come "
                    "from a fusion that marking can switch off. Likely causes: "
                    + (("the reduced precision (the keep-set search below names the nodes to keep in "
                        "FP32), a kernel that differs without fusion, or a rewrite of a single op in place."
                        if self._keepset else
                        "the reduced precision (the engine is rebuilt in FP32 below to prove it), a kernel "
                        "that differs without fusion, or a rewrite of a single op in place.")
                       if self.config.precision != "fp32" else
                       "a kernel that differs without fusion, a rewrite of a single op in place, or a "
                       "layout transform (the engine runs FP32, so precision is not the cause).")
                    + " The evidence below shows where the error starts."
                ),
            )
            if probe_fn and optimized:
                result["probe"] = probe_fn(optimized, units)
            return self._finish(result, t0)
        searchable = [u for u in units if u.blockable]
        self.expected_builds = self.builds + max(1, math.ceil(math.log2(max(len(searchable), 1)))) + 2
        seeds: list[Unit] = []
        by_idx = {u.index: u for u in units}
        if probe_fn and optimized:
            probe = probe_fn(optimized, units)
            result["probe"] = probe
            seeds = [by_idx[i] for i in probe.get("suspects", []) if i in by_idx and by_idx[i].blockable]
        cfg_level = self.config.with_level(level)
        if self.amplifies() and units:
            return self._finish(self._local_verdict(result, units, cfg_level), t0)
        held: list[Unit] = []
        culprits: list[list[Unit]] = []
        self.config, saved = cfg_level, self.config
        stopped = None
        try:
            while True:
                remaining = [u for u in searchable if u not in held]
                if not remaining:
                    break
                if held or confirmed is None:
                    proof = self._rest_proof(culprits, units, saved, level)
                    if proof is not None:
                        result["rest_proven_by"] = {
                            "step": proof.n, "kind": proof.kind, "ratio": proof.ratio,
                            "fused_nodes": proof.fused_in_build,
                            "why": ("the full engine with the culprits' passes disabled passes and holds "
                                    "every other fused node unchanged, so the remaining fusions pass "
                                    "together without a build of their own"),
                        }
                        break
                    check = self.evaluate("remaining fusions" if held else "all fusions at level",
                                          remaining, held=held)
                    if check.passed:
                        break
                # else: a suspect alone already fails at this level, so the fusions together
                # need no build to show that something fails; find_one names that suspect
                if len(culprits) >= self.max_culprits:
                    stopped = "max_culprits"
                    break
                found = self.find_one(remaining, held, seeds)
                if not found:
                    break
                culprits.append(found)
                held.extend(found)
                self.expected_builds = self.builds + max(1, math.ceil(math.log2(max(len(remaining), 1)))) + 2
        except BuildBudgetExceeded:
            stopped = "max_builds"
        finally:
            self.config = saved
        result["culprits"] = [[u.index for u in c] for c in culprits]
        result["verdict"] = "culprits" if culprits else "no_culprit"
        if stopped:
            remaining = [u for u in searchable if u not in held]
            result["stopped"] = stopped
            result["stopped_reason"] = (
                f"stopped after {len(culprits)} culprit(s) (--max-culprits) with the remaining "
                f"{len(remaining)} fused node(s) still failing together"
                if stopped == "max_culprits" else
                f"stopped after {self.builds} engine builds (--max-builds) with "
                f"{len(culprits)} culprit(s) found"
            ) + ("; when many fused nodes each break tolerance alone, the model is likely amplifying "
                 "FP32 rounding differences: see the sensitivity check and each culprit's isolated "
                 "evidence")
        if not culprits and not stopped:
            result["explanation"] = (
                "every fused node passes on its own and together once marked; the failure needs "
                "the unmarked engine (e.g. a fusion spanning several marked tensors)"
            )
        return self._finish(result, t0)

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
        batch = suspects_to_try(self.engine, units, probe_fn(optimized, units))
        batch = batch[: max(1, min(self.fanout, MAX_SEED_TRIES))]
        if not batch:
            return None
        self._prefetch_attribution(batch[0])
        steps = self.suspects_alone(batch, [])
        return next((u for u, st in zip(batch, steps) if not st.passed), None)

    def _prefetch_attribution(self, u: Unit) -> None:
        """The suspect's pass, found now on its subgraph (its tags, else group
        testing: tiny builds), and the full engine with that pass disabled built
        in a thread from here on: once the suspect is confirmed, its attribution
        and the rest proof ask for exactly that build, which otherwise ran alone
        at the end of the search while the second core idled. A suspect that is
        not confirmed leaves an unasked prefetch: not a step, not counted."""
        if self.findings is None or not self.can_prefetch():
            return
        from bisect_tui.core.bisect.subgraph_check import subgraph_file

        for c in self.findings.early_configs([u], self.config, lambda: subgraph_file(self.t, u)):
            self.prefetch(Candidate(self._map_kind(c), None, c))

    def suspects_alone(self, batch: list[Unit], held: list[Unit]) -> list[Step]:
        """Each suspect with every other fusion blocked: on its own subgraph
        where that stands for the whole graph (subgraph_check.py), else by a
        whole-graph build (one round for those)."""
        out: list[Optional[Step]] = [self._suspect_subgraph_step(u) for u in batch]
        rest = [i for i, st in enumerate(out) if st is None]
        if rest:
            steps = self.evaluate_many([Candidate("suspect alone", [batch[i]], held=held) for i in rest])
            for i, st in zip(rest, steps):
                out[i] = st
        return out  # type: ignore[return-value]

    def _suspect_subgraph_step(self, u: Unit) -> Optional[Step]:
        from bisect_tui.core.bisect.subgraph_check import suspect_on_subgraph

        key = stable_key(self.search_key, "subgraph/v1", self.config.to_dict(), sorted(u.original_nodes))
        kind = "suspect alone, on its subgraph"
        region = region_text([u])
        done = next((st for st in self.steps if st.key == key), None)
        if done is not None:
            return done
        cached = self._cache.get(key)
        if cached is not None:
            known = {k: v for k, v in cached.items() if k in Step.__dataclass_fields__}
            step = Step(**{**known, "n": len(self.steps) + 1, "kind": kind, "region": region,
                           "enabled": [u.index], "cached": True, "builds": self.builds})
            self.steps.append(step)
            self._report(step)
            return step
        if key in self._no_subgraph:
            return None
        self.t.cancel.check()
        self.t.progress(Progress("bisect", f"step {len(self.steps) + 1}: suspect {region} on its subgraph",
                                 self.builds, max(self.expected_builds, self.builds)))
        res = suspect_on_subgraph(self, u, self.config, self.dir / "subgraphs" / f"unit_{u.index}")
        if res is None:
            self._no_subgraph.add(key)
            return None
        j = res["judgement"]
        self.subgraph_builds += 1
        step = Step(
            n=len(self.steps) + 1, kind=kind, region=region, enabled=[u.index],
            config={"level": self.config.level, "disabled_optimizers": list(self.config.disabled_passes)},
            marks=0, passed=j.passed, ratio=_finite(j.ratio), max_abs=_finite(j.max_abs), summary=j.summary,
            builds=self.builds, cached=False, seconds=res["seconds"], key=key, worker="main", subgraph=True,
        )
        self.steps.append(step)
        self._append({**step.to_dict(), "at": now_iso()})
        self._cache[key] = step.to_dict()
        self._report(step)
        return step

    def amplifies(self) -> bool:
        """The check's sensitivity: a 1-ulp input change already breaks the tolerance."""
        return amplifies_rounding(self.t.fused)

    def _isolated_verdict(self, result: dict, units: list[Unit], cfg_level: EngineConfig,
                          unblocked: list[str]) -> dict:
        """The engine-neutral second switch: when marking every tensor left
        fusions in place, each fused region is extracted, fed the baseline's own
        tensors, run through the engine and judged against the unfused result
        (the rest of the graph is held at the baseline by construction)."""
        from bisect_tui.core.bisect.isolate import isolate

        rows, culprits = [], []
        for u in units:
            self.t.cancel.check()
            self.t.progress(Progress("bisect", f"region #{u.index} {u.fused_node} alone through the engine",
                                     u.index, len(units)))
            iso = isolate(self.t, [u], cfg_level, self.dir / "regions" / f"unit_{u.index}")
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
        result["explanation"] = (
            f"marking every tensor did not switch off {len(unblocked)} fusion(s) ({', '.join(unblocked[:4])}"
            f"{', ...' if len(unblocked) > 4 else ''}): the engine kept them behind the marked outputs, so "
            "each fused region was run alone through the engine on the baseline's own tensors and judged "
            f"there; {len(culprits)} break tolerance on their own")
        return result

    def _local_verdict(self, result: dict, units: list[Unit], cfg_level: EngineConfig) -> dict:
        """In a model that amplifies rounding the outputs blame every fusion, so
        each fused node is judged alone against float64 instead; only the ones
        far worse than the unfused FP32 ops are culprits."""
        from bisect_tui.core.bisect.local_judgement import judge_units

        local = judge_units(self.t, units, cfg_level, self.dir / "local", self.local_factor)
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
            result["with_local_culprits_held"] = step.to_dict()
        result["explanation"] = (
            "the model amplifies rounding (see sensitivity): every fusion breaks the output tolerance, so each "
            f"fused node was judged alone on the baseline's own inputs against float64; {len(worse)} are more "
            f"than {local['factor']:g}x further from it than the unfused FP32 ops, the other "
            f"{len(local['reorders_only'])} reorder rounding only")
        return result

    def _finish(self, result: dict, t0: float) -> dict:
        result["steps"] = [s.to_dict() for s in self.steps]
        result["engine_builds"] = self.builds
        result["reused_steps"] = sum(1 for s in self.steps if s.cached)
        result["engine_builds_all_runs"] = len(self._cache)
        result["seconds"] = time.perf_counter() - t0
        return result


def engine_levels(engine) -> tuple[str, ...]:
    caps = getattr(engine, "capabilities", None)
    return tuple(caps.levels) if caps is not None else LEVELS


def amplifies_rounding(fused: Optional[dict]) -> bool:
    """The check's sensitivity (its result `fused`) says a 1-ulp input change breaks the tolerance."""
    return bool(((fused or {}).get("sensitivity") or {}).get("amplifies"))


def tries_suspect_first(engine, config: EngineConfig, fused: Optional[dict]) -> bool:
    """Whether the search tries the probe's suspect alone at the user's level before
    anything else: not in a model that amplifies rounding (the check's sensitivity),
    not when that level is already the lowest."""
    levels = engine_levels(engine)
    return not (amplifies_rounding(fused) or config.level == levels[0] or len(levels) < 2)


def suspects_to_try(engine, units: list[Unit], probe: dict) -> list[Unit]:
    """The probe's suspects (own error, most first) that marking can block, less the
    nodes a layout rewrite made: such a node stands for a whole trunk, and the lower
    levels' finer map is worth their builds."""
    by_idx = {u.index: u for u in units}
    caps = getattr(engine, "capabilities", None)
    coarse = set(getattr(caps, "coarse_domains", ()) or ())
    seeds = [by_idx[i] for i in probe.get("suspects", []) if i in by_idx and by_idx[i].blockable]
    return [u for u in seeds if u.domain not in coarse]


def split_points(lo: int, hi: int, k: int) -> list[int]:
    """Up to k split points in [lo, hi), cutting it into k + 1 near-equal parts;
    for k = 1 the binary search's midpoint (lo + hi) // 2."""
    n = hi - lo
    if k <= 1:
        return [(lo + hi) // 2]
    pts = sorted({lo + (n * i) // (k + 1) for i in range(1, k + 1)} | set())
    pts = [p for p in pts if lo <= p < hi]
    return pts or [(lo + hi) // 2]


class BuildBudgetExceeded(Exception):
    def __init__(self, n: int):
        super().__init__(f"stopped after {n} engine builds (--max-builds)")


def _finite(x: float) -> float:
    try:
        return float(x) if math.isfinite(x) else (1e300 if x > 0 else -1e300)
    except TypeError:
        return float("nan")
