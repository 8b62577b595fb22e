"""Pass bisection: the smallest set of engine passes whose disabling makes the
full engine pass, by group testing over the engine's own list of passes.

The general fallback when no fused node can be blamed (a pass that rewrites
in place and makes no fused node, a failure that needs the unmarked engine,
an engine that fails to build or run): what torch's CompilerBisector does for
compiler passes, with adaptive splitting instead of one pass at a time.

It only proposes sets and learns pass or fail: `passes(disabled)` builds the
full engine with `disabled` switched off and says whether it passes (a real
build and run in the search, a fake oracle in the tests). Monotonicity is
assumed (disabling more never breaks a passing engine); every answer is still
a set the oracle itself saw passing, never an inference.

Cost per pass found: one build for "everything disabled" (is any pass the
cause at all), about log2(n) for the prefix search, one to check the set
alone: about log2(n) + 2. A container pass (a group of rewrite rules the
engine also lets one disable one by one) is then split the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

Oracle = Callable[[Sequence[str]], bool]


@dataclass
class PassSearch:
    """One group test, with every set it tried (in order) for the record."""

    passes: Oracle
    tried: list[dict] = field(default_factory=list)
    _seen: dict = field(default_factory=dict)

    def ask(self, disabled: Sequence[str]) -> bool:
        key = frozenset(disabled)
        if key not in self._seen:
            self._seen[key] = bool(self.passes(sorted(key)))
            self.tried.append({"disabled": sorted(key), "passed": self._seen[key]})
        return self._seen[key]

    @property
    def builds(self) -> int:
        return len(self._seen)

    def minimal(self, cands: Sequence[str], fixed: Sequence[str] = ()) -> Optional[list[str]]:
        """A minimal subset S of `cands` such that disabling `fixed` + S passes
        (None when disabling all of `cands` does not). Binary search for the
        shortest passing prefix: its last pass is needed; keep it, search the
        passes before it for any partner it needs, until the kept set passes."""
        cands = list(dict.fromkeys(c for c in cands if c not in fixed))
        base = list(fixed)
        if not cands or not self.ask(base + cands):
            return None
        found: list[str] = []
        while cands:
            lo, hi = 0, len(cands) - 1  # cands[:hi+1] with found passes
            while lo < hi:
                mid = (lo + hi) // 2
                if self.ask(base + found + cands[: mid + 1]):
                    hi = mid
                else:
                    lo = mid + 1
            found.append(cands[lo])
            if self.ask(base + found):
                return found
            cands = cands[:lo]
        # not monotone: the whole prefix passed, the parts found do not; report what passed
        return found if self.ask(base + found) else None


def flatten(candidates: Sequence[str], groups: Mapping[str, Sequence[str]]) -> list[str]:
    """One list for one group test: each container's members just before the
    container itself, so a member the failure needs is found (a shorter prefix)
    before its container, and a container whose member list misses the rule
    at fault is still found as a whole."""
    out: list[str] = []
    for c in candidates:
        out.extend(m for m in groups.get(c, ()) if m != c)
        out.append(c)
    return list(dict.fromkeys(out))


def search_passes(passes: Oracle, candidates: Sequence[str], groups: Optional[Mapping[str, Sequence[str]]] = None,
                  alternatives: int = 2) -> dict:
    """The group test over `candidates` (the engine's passes, in the order it runs
    them; `groups`: containers and their members). Returns {"found": [...] or
    None, "alternatives": [[...], ...], "builds": n, "tried": [...]}: `found` is a
    minimal set; each alternative is another minimal set among the passes left,
    found when disabling all of those passes passes too (a failure that needs
    several passes together: disabling any one of them fixes it)."""
    groups = groups or {}
    ps = PassSearch(passes)
    flat = flatten(candidates, groups)
    result: dict = {"candidates": len(flat), "found": None, "alternatives": []}
    found = ps.minimal(flat)
    if found is not None:
        result["found"] = found
        used = set(found)
        for _ in range(alternatives):
            # a container of a pass already used would switch that pass off again
            rest = [c for c in flat if c not in used and not used.intersection(groups.get(c, ()))]
            alt = ps.minimal(rest)
            if not alt:
                break
            result["alternatives"].append(alt)
            used.update(alt)
    result["builds"] = ps.builds
    result["tried"] = ps.tried
    return result
