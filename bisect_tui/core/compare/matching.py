"""Which golden tensor each test tensor is judged against.

Engines rename everything (`logits` becomes `output_0`, `/lm_head/MatMul:0`
becomes `lm_head_MatMul_0.npy`), so names are matched in this order: a rule of
the mapping file, the same name, the same file-safe name, and, when each side
is one lone array, the two arrays. A mapping file (JSON or YAML) maps test
names to golden names; globs on the test side capture text that fills the
golden side's wildcards in order (`"dec_*": "decoder/*:0"`). A rule can also
say how the test tensor was stored (`dtype`, `scale`, `zero_point`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from bisect_tui.core.compare.globs import MAX_PATTERN, captures, matches
from bisect_tui.core.compare.records import Loaded, Pair, Source, Unmatched
from bisect_tui.core.bounded import excerpt, read_structured
from bisect_tui.core.errors import UserError
from bisect_tui.core.escape import safe_filename, term

RULE_KEYS = ("golden", "dtype", "scale", "zero_point")
DTYPE_HINTS = ("fp16", "bf16", "fp32", "fp64", "int8", "uint8", "int32", "float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True)
class Rule:
    test: str  # name or glob
    golden: Optional[str]  # name or glob with wildcards filled from the test's; None = same name
    dtype: Optional[str] = None
    scale: Optional[float] = None
    zero_point: float = 0.0
    origin: str = "mapping file"


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            return float(str(value))
        except ValueError:
            raise UserError(f"{what}: {excerpt(value)!r} is not a number") from None
    return float(value)


def check_dtype_hint(kind: str, where: str) -> str:
    k = str(kind).strip().lower().replace("float16", "fp16").replace("bfloat16", "bf16")
    k = {"half": "fp16", "float32": "fp32", "float64": "fp64", "double": "fp64"}.get(k, k)
    if k not in DTYPE_HINTS:
        hint = difflib.get_close_matches(k, DTYPE_HINTS, n=1)
        raise UserError(f"{where}: unknown dtype {excerpt(kind)!r}; valid: {', '.join(DTYPE_HINTS)}"
                        + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    return k


def load_mapping(path: Path) -> tuple[Rule, ...]:
    """Rules from a JSON or YAML file: ``{test: golden}`` or ``{test: {golden:, dtype:, scale:, zero_point:}}``,
    optionally under a top-level ``map:`` key. YAML is read with safe_load: no tags, no objects."""
    path = Path(path)
    data = read_structured(path, "mapping file")
    if isinstance(data, dict) and set(data) == {"map"}:
        data = data["map"]
    if not isinstance(data, dict) or not data:
        raise UserError(f"mapping file {term(path)}: expected a mapping of test name -> golden name")
    rules = []
    for test, value in data.items():
        where = f"mapping file {term(path)}, entry {excerpt(test)!r}"
        if len(str(test)) > MAX_PATTERN or (isinstance(value, str) and len(value) > MAX_PATTERN):
            raise UserError(f"{where}: a name or pattern of over {MAX_PATTERN} characters; refused")
        if value is None or isinstance(value, str):
            rules.append(Rule(str(test), value, origin=f"mapping file rule {test!r}"))
            continue
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a golden name or a table with keys {', '.join(RULE_KEYS)}")
        unknown = set(value) - set(RULE_KEYS)
        if unknown:
            raise UserError(f"{where}: unknown key(s) {excerpt(', '.join(sorted(map(str, unknown))))}; "
                            f"valid: {', '.join(RULE_KEYS)}")
        golden = value.get("golden")
        if golden is not None and (not isinstance(golden, str) or len(golden) > MAX_PATTERN):
            raise UserError(f"{where}: golden must be a name (at most {MAX_PATTERN} characters)")
        rules.append(Rule(
            str(test), golden,
            dtype=check_dtype_hint(value["dtype"], where) if value.get("dtype") is not None else None,
            scale=_number(value["scale"], where) if value.get("scale") is not None else None,
            zero_point=_number(value.get("zero_point", 0), where),
            origin=f"mapping file rule {test!r}",
        ))
    return tuple(rules)


def _fill(golden: str, caught: tuple[str, ...]) -> str:
    """Replace the golden pattern's wildcards, left to right, by the captured text."""
    caps = list(caught)
    out = []
    for c in golden:
        if c in "*?" and caps:
            out.append(caps.pop(0))
        else:
            out.append(c)
    return "".join(out)


def _safe(name: str) -> str:
    return safe_filename(name, max_len=200).lower()


def suggestions(name: str, candidates: list[str]) -> tuple[str, ...]:
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
    if not close:
        by_safe = {_safe(c): c for c in candidates}
        close = [by_safe[s] for s in difflib.get_close_matches(_safe(name), list(by_safe), n=3, cutoff=0.5)]
    return tuple(close)


@dataclass(frozen=True)
class Hints:
    """--test-dtype and --scale from the command line (glob -> value)."""

    dtypes: tuple[tuple[str, str], ...] = ()
    scales: tuple[tuple[str, float, float], ...] = ()


def match(golden: Source, test: Source, rules: tuple[Rule, ...] = (), hints: Hints = Hints()
          ) -> tuple[list[Pair], list[Unmatched], list[Unmatched], list[str]]:
    """Pairs, test tensors without a golden one, golden tensors no test tensor uses, notes."""
    g_by_name = golden.by_name()
    g_names = list(g_by_name)
    g_by_safe: dict[str, list[Loaded]] = {}
    for g in golden.tensors:
        g_by_safe.setdefault(_safe(g.name), []).append(g)
    used_rules: set[int] = set()
    pairs: list[Pair] = []
    unmatched: list[Unmatched] = []
    # two lone .npy files (golden.npy vs trt_output.npy): their stems are not names
    lone = len(golden.tensors) == 1 and len(test.tensors) == 1 and golden.kind == test.kind == "npy"

    for t in test.tensors:
        rule_i, rule, target, how = None, None, None, ""
        for i, r in enumerate(rules):
            caps = captures(r.test, t.name)
            if caps is not None:
                rule_i, rule = i, r
                break
        if rule is not None:
            used_rules.add(rule_i)
            want = _fill(rule.golden, caps) if rule.golden else t.name
            if want in g_by_name:
                target, how = g_by_name[want], f"{rule.origin} -> {want!r}"
            elif any(c in want for c in "*?["):
                hits = [g for g in golden.tensors if matches(want, g.name)]
                if len(hits) > 1:
                    raise UserError(
                        f"{term(rule.origin)}: test {term(t.name)!r} -> golden {term(want)!r} matches "
                        f"{len(hits)} golden tensors ({', '.join(term(h.name) for h in hits[:3])}...); make it specific")
                if hits:
                    target, how = hits[0], f"{rule.origin} -> {hits[0].name!r}"
            if target is None and rule.golden:
                unmatched.append(Unmatched("test", t.name + f" -> {want}", suggestions(want, g_names)))
                continue
        if target is None and t.name in g_by_name:
            target, how = g_by_name[t.name], "same name"
        if target is None and len(g_by_safe.get(_safe(t.name), [])) == 1:
            target, how = g_by_safe[_safe(t.name)][0], "same file-safe name"
        if target is None and lone:
            target, how = golden.tensors[0], "the only array on each side"
        if target is None:
            unmatched.append(Unmatched("test", t.name, suggestions(t.name, g_names)))
            continue
        dtype = rule.dtype if rule else None
        scale, zp = (rule.scale, rule.zero_point) if rule else (None, 0.0)
        for pat, kind in hints.dtypes:
            if matches(pat, t.name):
                dtype = kind
                break
        for pat, s, z in hints.scales:
            if matches(pat, t.name):
                scale, zp = s, z
                break
        pairs.append(Pair(t, target, how, dtype, scale, zp))

    used = {p.golden.name for p in pairs}
    t_names = [t.name for t in test.tensors]
    spare = [Unmatched("golden", g.name, suggestions(g.name, t_names) if golden.kind != "session" else ())
             for g in golden.tensors if g.name not in used]
    literal = [r for i, r in enumerate(rules) if i not in used_rules and not any(c in r.test for c in "*?[")]
    if literal:
        # a plain name is a claim that the tensor exists: a typo must not pass as "no rule applied"
        hint = suggestions(literal[0].test, t_names)
        raise UserError(f"{excerpt(literal[0].origin)} names test tensor {excerpt(literal[0].test)!r}, which "
                        f"the TEST dump does not hold" + (f" (did you mean {', '.join(repr(excerpt(h)) for h in hint)}?)"
                                                          if hint else "")
                        + (f"; {len(literal) - 1} more rule(s) like it" if len(literal) > 1 else ""))
    notes = [f"{r.origin} matched no test tensor" + (
        f" (did you mean {', '.join(repr(s) for s in suggestions(r.test, t_names))}?)"
        if suggestions(r.test, t_names) else "")
        for i, r in enumerate(rules) if i not in used_rules]
    return pairs, unmatched, spare, notes
