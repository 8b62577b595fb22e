"""Optimization profiles from the user's shapes.

TensorRT builds a network with dynamic input dims only with an optimization
profile (min/opt/max per input). Polygraphy would otherwise invent one from
its DEFAULT_SHAPE_VALUE, i.e. build for shapes the user never runs. Here the
profile is exactly the shapes the triage runs (`--shape`, or the shapes of the
`--input` arrays): min = opt = max, so the engine under test is optimized for
those shapes and nothing else. A range (`min:opt:max` per input) may widen it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from bisect_tui.core.errors import UserError


@dataclass(frozen=True)
class ProfileSpec:
    input: str
    min: tuple
    opt: tuple
    max: tuple


def _check(spec: ProfileSpec, declared: Sequence) -> None:
    for lbl, shape in (("min", spec.min), ("opt", spec.opt), ("max", spec.max)):
        if len(shape) != len(declared):
            raise UserError(
                f"shape for input {spec.input!r} has {len(shape)} dims ({lbl}), the model declares {len(declared)}"
            )
        for i, (d, want) in enumerate(zip(shape, declared)):
            if d < 1:
                raise UserError(f"input {spec.input!r} dim {i}: {d} is not a size")
            if isinstance(want, int) and want >= 0 and d != want:
                raise UserError(f"input {spec.input!r} dim {i} is fixed at {want} in the model, got {d}")
    for i, (a, b, c) in enumerate(zip(spec.min, spec.opt, spec.max)):
        if not a <= b <= c:
            raise UserError(f"input {spec.input!r} dim {i}: need min <= opt <= max, got {a}, {b}, {c}")


def build_profiles(
    inputs: Sequence,  # objects with .name and .shape (ints for static dims)
    shapes: dict,  # input name -> concrete dims the triage runs
    ranges: Optional[dict] = None,  # input name -> (min, opt, max) dims
) -> list[ProfileSpec]:
    """One profile's specs, or [] when every input is static (no profile needed)."""
    ranges = ranges or {}
    dynamic = [i for i in inputs if not all(isinstance(d, int) and d >= 0 for d in i.shape)]
    if not dynamic and not ranges:
        return []
    specs = []
    for inp in inputs:
        if inp.name in ranges:
            lo, opt, hi = (tuple(int(x) for x in s) for s in ranges[inp.name])
        elif inp.name in shapes:
            lo = opt = hi = tuple(int(x) for x in shapes[inp.name])
        elif all(isinstance(d, int) and d >= 0 for d in inp.shape):
            lo = opt = hi = tuple(inp.shape)
        else:
            unknown = [str(d) if d else "?" for d in inp.shape if not (isinstance(d, int) and d >= 0)]
            raise UserError(
                f"input {inp.name!r} has dynamic dims ({', '.join(unknown)}): give --shape "
                f"{inp.name}=... so TensorRT builds for the shapes you run"
            )
        spec = ProfileSpec(inp.name, lo, opt, hi)
        _check(spec, inp.shape)
        specs.append(spec)
    return specs


def parse_profile_range(item: str) -> tuple[str, tuple]:
    """`x=1x3x8x8:4x3x8x8:8x3x8x8` -> ("x", (min, opt, max))."""
    if "=" not in item:
        raise UserError(f"bad profile {item!r}: expected NAME=MIN:OPT:MAX, e.g. x=1x3x8x8:4x3x8x8:8x3x8x8")
    name, rest = item.split("=", 1)
    parts = rest.split(":")
    if len(parts) != 3:
        raise UserError(f"bad profile {item!r}: expected three shapes MIN:OPT:MAX")
    try:
        dims = tuple(tuple(int(x) for x in p.lower().split("x")) for p in parts)
    except ValueError:
        raise UserError(f"bad profile {item!r}: shapes are numbers joined by x") from None
    return name.strip(), dims


def fnmatch_literal(name: str) -> str:
    """`name` as an fnmatch pattern matching only itself.

    Polygraphy's `Profile.fill_defaults` and `to_trt` look inputs up with
    fnmatch (`util.match_keys`): a key `x[0]` would match `x0` and not
    itself, `a*` every input starting with `a`. `*`, `?` and `[` become
    one-character classes; a lone `]` is literal already."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def to_polygraphy(specs: Sequence[ProfileSpec]) -> list:
    """Polygraphy `Profile` objects for `CreateConfig(profiles=...)` (pure
    Python; TensorRT is only needed when the config is created), keyed by
    each input's name as a literal pattern."""
    if not specs:
        return []
    from polygraphy.backend.trt import Profile

    prof = Profile()
    for s in specs:
        prof.add(fnmatch_literal(s.input), min=list(s.min), opt=list(s.opt), max=list(s.max))
    return [prof]
