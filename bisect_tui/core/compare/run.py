"""`compare GOLDEN TEST`: load, match, align dtypes and shapes, judge, look for pitfalls.

The judging is the landed core's (metrics.compare through tolerance.judge_arrays),
so a tensor compared here and the same tensor compared by `check` get the same
numbers and the same verdict. Bad input (missing file, object array, shapes
that are not the same tensor, names that match nothing) raises UserError
before any verdict is formed: exit 2, never a misleading 0 or 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from bisect_tui.core.compare import dtypes, pitfalls, shapes
from bisect_tui.core.compare.loading import load_source, read_array
from bisect_tui.core.compare.matching import Hints, load_mapping, match
from bisect_tui.core.compare.records import CompareResult, Conversion, Finding, Pair, TensorResult
from bisect_tui.core.errors import EnvironmentFault, UserError
from bisect_tui.core.escape import term
from bisect_tui.core.metrics import align, compare
from bisect_tui.core.tolerance import DEFAULT_TOPK, ToleranceSpec, judge_arrays, parse_tolerance

HIST_BINS = 40


@dataclass(frozen=True)
class CompareOptions:
    mapping: Optional[Path] = None
    preset: Optional[str] = None  # None: from each test tensor's dtype (fp16 -> fp16, bf16 -> bf16...)
    atol: Optional[float] = None
    rtol: Optional[float] = None
    min_cosine: Optional[float] = None
    overrides: tuple[str, ...] = ()
    topk: Optional[int] = None
    softmax_axis: Optional[int] = None
    hints: Hints = field(default_factory=Hints)
    skip_unmatched: bool = False
    hist_bins: int = HIST_BINS


class _Specs:
    """One ToleranceSpec per preset actually needed, all built from the same flags."""

    def __init__(self, opts: CompareOptions):
        self.opts = opts
        self._cache: dict[str, ToleranceSpec] = {}
        self.default = self.get(opts.preset or "fp32")  # validates every flag up front

    def get(self, preset: str) -> ToleranceSpec:
        if preset not in self._cache:
            o = self.opts
            self._cache[preset] = parse_tolerance(preset, o.atol, o.rtol, o.min_cosine, o.overrides)
        return self._cache[preset]


def _naive_max_abs(g_raw: np.ndarray, t_raw: np.ndarray) -> Optional[float]:
    """max |golden - test| on the values as stored, i.e. what a script that skips the
    dtype step would see."""
    try:
        return float(compare(g_raw, t_raw, hist_bins=1)["max_abs"])
    except (ValueError, TypeError):
        return None


def _one(pair: Pair, golden_samples_axis: bool, opts: CompareOptions, specs: _Specs) -> TensorResult:
    g_raw = read_array(pair.golden, "GOLDEN")
    t_raw = read_array(pair.test, "TEST")
    g, g_conv, _ = dtypes.to_comparable(g_raw, "golden", t_raw, name=pair.golden.name)
    t, t_conv, t_prec = dtypes.to_comparable(t_raw, "test", g, pair.dtype_hint, pair.scale, pair.zero_point,
                                             name=pair.test.name)
    why = shapes.explain(tuple(g.shape), tuple(t.shape), golden_samples_axis)
    if why is not None:
        raise UserError(f"shape mismatch, test {term(pair.test.name)!r} vs golden {term(pair.golden.name)!r}: {why}")
    g, t = align(g, t)
    conversions: list[Conversion] = [*g_conv, *t_conv]
    findings: list[Finding] = []
    if opts.softmax_axis is not None:
        if g.ndim == 0 or not -g.ndim <= opts.softmax_axis < g.ndim:
            raise UserError(f"--softmax {opts.softmax_axis}: no such axis in {term(pair.test.name)!r} of shape "
                            f"{tuple(g.shape)}")
        g, c1 = pitfalls.apply_softmax(g, "golden", opts.softmax_axis)
        t, c2 = pitfalls.apply_softmax(t, "test", opts.softmax_axis)
        conversions += [c1, c2]
    conversions += dtypes.widenings(g, t)

    preset = opts.preset or dtypes.hint_for_preset(t_prec)
    spec = specs.get(preset)
    tol = spec.for_output(pair.test.name)
    pattern = spec.override_pattern(pair.test.name)
    if pattern is not None:
        source = f"--tol {pattern!r}"
    elif opts.preset:
        source = f"--preset {opts.preset}"
    else:
        source = f"the test's dtype {t_prec}; --preset chooses another"
    k = tol.k or opts.topk or DEFAULT_TOPK
    with_topk = g.ndim >= 1 and g.shape[-1] >= 2 and (np.issubdtype(g.dtype, np.floating) or g.dtype.kind == "V")
    metrics, verdict = judge_arrays(g, t, tol, topk=k if with_topk or tol.k else None, hist_bins=opts.hist_bins)

    if not verdict.passed:
        if opts.softmax_axis is None:
            f = pitfalls.softmax_one_side(g, t, -1)
            if f:
                findings.append(f)
        f = pitfalls.batch_order(g, t, tol, k if tol.k else None)
        if f:
            findings.append(f)
    f = pitfalls.ranking(pair.test.name, metrics, verdict, asked=bool(opts.topk or tol.k))
    if f and not findings:  # after a softmax or batch-order finding, the ranking says nothing new
        findings.append(f)
    reinterpreted = any(c.side == "test" and ("raw" in c.how or "dequantized" in c.how) for c in t_conv)
    naive = _naive_max_abs(np.asarray(g_raw), np.asarray(t_raw)) if reinterpreted else None
    return TensorResult(pair, tuple(int(d) for d in g.shape), tuple(conversions), tol, source, metrics, verdict,
                        tuple(findings), naive)


def compare_dumps(golden_path: Path, test_path: Path, opts: CompareOptions = CompareOptions(),
                  progress: Optional[Callable[[int, int, str], None]] = None) -> CompareResult:
    specs = _Specs(opts)
    golden = load_source(Path(golden_path), "GOLDEN")
    test = load_source(Path(test_path), "TEST")
    rules = load_mapping(opts.mapping) if opts.mapping else ()
    pairs, unmatched, spare, notes = match(golden, test, rules, opts.hints)
    if not pairs:
        listed = ", ".join(term(u.text()) for u in unmatched[:5])
        raise UserError(f"no test tensor matches a golden tensor by name ({listed}); "
                        "map the names with --map FILE (JSON or YAML, globs allowed)")
    if unmatched and not opts.skip_unmatched:
        listed = "; ".join(term(u.text()) for u in unmatched[:5]) + ("; ..." if len(unmatched) > 5 else "")
        raise UserError(f"{len(unmatched)} test tensor(s) have no golden match: {listed}; map the names with "
                        "--map FILE, or --skip-unmatched to compare the rest")
    unused = specs.default.unused([p.test.name for p in pairs])
    notes += [f"--tol pattern {p!r} matches no compared test tensor" for p in unused]
    if golden.kind == "session" and spare:
        notes.append(f"{len(spare)} golden tensor(s) of the session baseline have no test counterpart "
                     "(a baseline holds every intermediate tensor; only matched ones are judged)")
    results = []
    for i, pair in enumerate(pairs):
        if progress:
            progress(i, len(pairs), pair.test.name)
        try:
            results.append(_one(pair, golden.samples_axis, opts, specs))
        except MemoryError:
            # the machine, not the user's data nor a bug: the same exit (5) check and bisect give
            raise EnvironmentFault(f"out of memory comparing {term(pair.test.name)} "
                                   f"(shape {tuple(pair.test.shape)}); free memory or compare fewer tensors") from None
    if golden.kind == "session":
        notes.append(f"{len(pairs)} session baseline file(s) read, each matching its manifest SHA-256")
    return CompareResult(golden, test, specs.default, tuple(results), tuple(unmatched),
                         tuple(spare), opts.mapping, tuple(notes))
