"""The exact input(s) every run uses: generated from a seed or loaded from a file.

Arrays are stored with a leading *sample* axis: `input.npz[name]` has shape
`(samples, *input_shape)`. The same convention holds for every tensor the tool
dumps, so sample k of anything is `array[k]`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from bisect_tui.core.errors import UserError
from bisect_tui.core.model import ModelInfo

_SHAPE_RE = re.compile(r"^\s*([^=]+?)\s*=\s*([0-9]+(?:\s*[x,*]\s*[0-9]+)*)\s*$")


def parse_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """`--shape x=1x3x224x224` (or `batch=1` for a named dim) -> {key: dims}."""
    out: dict[str, list[int]] = {}
    for item in items or ():
        m = _SHAPE_RE.match(item)
        if not m:
            raise UserError(
                f"bad --shape {item!r}: expected NAME=1x3x224x224 (an input name) or DIM=8 (a dim name)"
            )
        out[m.group(1)] = [int(x) for x in re.split(r"\s*[x,*]\s*", m.group(2))]
    return out


def parse_value_ranges(items: Sequence[str]) -> dict[str, tuple[float, float]]:
    """`--input-range ids=0:30000` -> {name: (lo, hi)}."""
    out: dict[str, tuple[float, float]] = {}
    for item in items or ():
        try:
            name, rng = item.split("=", 1)
            lo, hi = rng.split(":", 1)
            out[name.strip()] = (float(lo), float(hi))
        except ValueError:
            raise UserError(f"bad range {item!r}: expected NAME=MIN:MAX") from None
        if not all(math.isfinite(v) for v in out[name.strip()]):
            raise UserError(f"bad range {item!r}: MIN and MAX must be finite numbers")
        if not out[name.strip()][0] < out[name.strip()][1]:
            raise UserError(f"bad range {item!r}: MIN must be below MAX")
    return out


InputValue = Union[int, float, bool]


def parse_input_values(items: Sequence[str]) -> dict[str, InputValue]:
    """`--input-value sr=16000` (or `flag=true`) -> {name: value}: the whole input
    is filled with that one value (a sample rate, a flag, a fixed length)."""
    out: dict[str, InputValue] = {}
    for item in items or ():
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name or not text:
            raise UserError(f"bad --input-value {item!r}: expected NAME=VALUE, e.g. sr=16000")
        low = text.lower()
        if low in ("true", "false"):
            out[name] = low == "true"
            continue
        try:
            out[name] = int(text)
        except ValueError:
            try:
                out[name] = float(text)
            except ValueError:
                raise UserError(f"bad --input-value {item!r}: {text!r} is not a number or true/false") from None
    return out


def value_text(v: InputValue) -> str:
    """A fixed value as the user writes it on the command line."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"{v:g}" if isinstance(v, float) else str(v)


def usable_dim_name(name: object) -> bool:
    """A dim name the user can give a value by (`--shape batch=1`). Exporters
    write placeholders such as '?' or '-1' for every unknown dim alike; those
    name nothing, so they count as unnamed."""
    return isinstance(name, str) and bool(name.strip()) and name.strip() not in ("?", "-1", "None", "none")


@dataclass
class InputSet:
    """The arrays plus where they came from (seed or file), for the report."""

    arrays: dict[str, np.ndarray]  # name -> (samples, *shape)
    source: dict = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return next(iter(self.arrays.values())).shape[0] if self.arrays else 0

    def feeds(self, k: int) -> dict[str, np.ndarray]:
        # asarray, not ascontiguousarray: that one turns a rank-0 (scalar) input into shape (1,)
        return {n: np.asarray(a[k], order="C") for n, a in self.arrays.items()}

    def describe(self) -> list[dict]:
        """Per input: shape, dtype, range and how it was made. Integer and bool
        inputs also list their distinct values when there are few (a sample rate,
        a mask): they decide what the model computes, so a report must show them."""
        how = self.source.get("how") or {}
        out = []
        for n, a in self.arrays.items():
            e = {
                "name": n,
                "shape": list(a.shape[1:]),
                "dtype": a.dtype.name,
                "min": float(a.min()) if a.size and a.dtype.kind in "fiub" else None,
                "max": float(a.max()) if a.size and a.dtype.kind in "fiub" else None,
            }
            if n in how:
                e["how"] = how[n]
            elif self.source.get("kind") == "file":
                e["how"] = "from the input file"
            if a.dtype.kind in "iub" and a.size:
                distinct = np.unique(a[: min(len(a), 4)].reshape(-1)[:100_000])
                if len(distinct) <= 4:
                    e["values"] = [bool(v) if a.dtype.kind == "b" else int(v) for v in distinct]
            out.append(e)
        return out


def guessed_inputs_hint(inputs: InputSet) -> str:
    """When the run fails, point at the inputs whose values were guessed: random
    integers (a sample rate, a length) are the usual reason a real model refuses."""
    how = inputs.source.get("how") or {}
    guessed = [n for n, a in inputs.arrays.items()
               if a.dtype.kind in "iub" and "random" in how.get(n, "") and "mask" not in how.get(n, "")]
    if not guessed:
        return ""
    return ("; the values of " + ", ".join(f"'{n}'" for n in guessed) + " were random guesses: give real ones "
            "with " + " ".join(f"--input-value {n}=VALUE" for n in guessed) + " or --input FILE.npz")


def _gather_bound(info: ModelInfo, name: str) -> Optional[int]:
    """Upper bound for integer inputs used as indices (token ids -> embedding rows)."""
    inits = {t.name: t for t in info.model.graph.initializer}
    bound = None
    for node_name in info.index.consumers.get(name, []):
        node = info.index.by_name[node_name]
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name:
            data = inits.get(node.input[0])
            if data is not None and data.dims:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                rows = int(data.dims[axis])
                bound = rows if bound is None else min(bound, rows)
    return bound


def generate_inputs(
    info: ModelInfo,
    shapes: dict[str, list[int]],
    seed: int = 0,
    samples: int = 1,
    value_ranges: Optional[dict[str, tuple[float, float]]] = None,
    values: Optional[dict[str, InputValue]] = None,
) -> InputSet:
    """Seeded random inputs with value ranges that make sense for each input kind.

    Fixed values (`--input-value`) fill the whole input. Floats: standard normal.
    Index-like ints feeding a Gather: uniform below the table size. Names
    containing "mask": ones. Other ints: 0..9 (said so in the report). Bools: random."""
    if samples < 1:
        raise UserError(f"--samples must be at least 1, got {samples}")
    value_ranges = value_ranges or {}
    values = values or {}
    names = {s.name for s in info.inputs}
    unknown = set(value_ranges) - names
    if unknown:
        raise UserError(f"--input-range names unknown input(s): {', '.join(sorted(unknown))}")
    unknown = set(values) - names
    if unknown:
        raise UserError(f"--input-value names unknown input(s): {', '.join(sorted(unknown))}; "
                        f"the model's inputs: {', '.join(s.name for s in info.inputs)}")
    both = set(values) & set(value_ranges)
    if both:
        raise UserError(f"input {sorted(both)[0]!r} has both --input-value and --input-range: give one")
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    how: dict[str, str] = {}
    for spec in info.inputs:
        shape = (samples, *shapes[spec.name])
        dt = np.dtype(spec.dtype) if not spec.dtype.startswith("onnx_type") else None
        if dt is None:
            raise UserError(f"input '{spec.name}' has a type bisect-tui cannot generate ({spec.dtype})")
        lo_hi = value_ranges.get(spec.name)
        if spec.name in values:
            arrays[spec.name] = _filled(spec.name, dt, shape, values[spec.name])
            how[spec.name] = f"fixed value {value_text(values[spec.name])} (--input-value)"
            continue
        if dt.kind == "f":
            if lo_hi:
                a = rng.uniform(lo_hi[0], lo_hi[1], size=shape)
                how[spec.name] = f"uniform[{lo_hi[0]:g}, {lo_hi[1]:g})"
            else:
                a = rng.standard_normal(size=shape)
                how[spec.name] = "standard normal"
            arrays[spec.name] = a.astype(dt)
        elif dt.kind in "iu":
            if lo_hi:
                lo, hi = int(lo_hi[0]), int(lo_hi[1])
            elif "mask" in spec.name.lower():
                lo, hi = 1, 2
            else:
                bound = _gather_bound(info, spec.name)
                lo, hi = (0, bound) if bound else (0, 10)
            arrays[spec.name] = rng.integers(lo, hi, size=shape).astype(dt)
            if lo_hi:
                why = " (--input-range)"
            elif "mask" in spec.name.lower():
                why = " (a mask: all ones)"
            elif _gather_bound(info, spec.name):
                why = " (indices below the size of the table they select from)"
            else:
                why = " (no hint in the model: give a real value with --input-value or --input-range)"
            how[spec.name] = f"random integers in [{lo}, {hi}){why}"
        elif dt.kind == "b":
            if "mask" in spec.name.lower():
                arrays[spec.name] = np.ones(shape, dtype=bool)
                how[spec.name] = "all true (mask)"
            else:
                arrays[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
                how[spec.name] = "random booleans"
        else:
            raise UserError(f"input '{spec.name}' has a type bisect-tui cannot generate ({spec.dtype})")
    return InputSet(arrays, {"kind": "seed", "seed": seed, "samples": samples, "how": how})


def _filled(name: str, dt: np.dtype, shape: tuple, value: InputValue) -> np.ndarray:
    if dt.kind in "iu":
        if isinstance(value, bool) or float(value) != int(value):
            raise UserError(f"--input-value {name}={value_text(value)}: the input is {dt.name}, give an integer")
        info = np.iinfo(dt)
        if not info.min <= int(value) <= info.max:
            raise UserError(f"--input-value {name}={value_text(value)} does not fit {dt.name}")
        return np.full(shape, int(value), dtype=dt)
    if dt.kind == "b":
        if value not in (0, 1, True, False):
            raise UserError(f"--input-value {name}={value_text(value)}: the input is bool, give true or false")
        return np.full(shape, bool(value), dtype=bool)
    return np.full(shape, float(value), dtype=dt)


def load_inputs(
    info: ModelInfo, path: Path, shapes: Optional[dict[str, list[int]]] = None
) -> InputSet:
    """Load `.npy` (single-input models) or `.npz` and check names, shapes, dtypes.

    An array may have exactly the input's shape (one sample) or one extra
    leading axis (several samples)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"input file not found: {p}")
    try:
        if p.suffix == ".npy":
            arr = np.load(p, allow_pickle=False)
            if len(info.inputs) != 1:
                raise UserError(
                    f"{p.name} holds one array but the model has {len(info.inputs)} inputs "
                    f"({', '.join(s.name for s in info.inputs)}); use an .npz keyed by input name"
                )
            raw = {info.inputs[0].name: arr}
        elif p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                raw = {k: z[k] for k in z.files}
        else:
            raise UserError(f"input file must be .npy or .npz, got {p.name}")
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"cannot read input file {p}: {str(exc).splitlines()[0]}") from None
    names = [s.name for s in info.inputs]
    missing = [n for n in names if n not in raw]
    extra = [n for n in raw if n not in names]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected {', '.join(extra)}")
        raise UserError(
            f"input file {p.name} does not match the model's inputs ({'; '.join(parts)}); "
            f"expected: {', '.join(names)}"
        )
    shapes = shapes or {}
    arrays: dict[str, np.ndarray] = {}
    samples = None
    for spec in info.inputs:
        a = raw[spec.name]
        if a.dtype.name != spec.dtype:
            raise UserError(
                f"input '{spec.name}' in {p.name} is {a.dtype.name}, the model expects "
                f"{spec.dtype} (convert with arr.astype(np.{spec.dtype}))"
            )
        want = shapes.get(spec.name) or spec.shape
        if a.ndim == len(want):
            a = a[None]
        elif a.ndim != len(want) + 1:
            raise UserError(
                f"input '{spec.name}' in {p.name} has shape {'x'.join(map(str, a.shape))}, "
                f"the model expects {spec.shape_text()} (optionally with a leading samples axis)"
            )
        for axis, (g, d) in enumerate(zip(a.shape[1:], want)):
            if isinstance(d, int) and g != d:
                raise UserError(
                    f"input '{spec.name}' in {p.name} has shape {'x'.join(map(str, a.shape[1:]))}, "
                    f"the model expects {spec.shape_text()} (axis {axis}: {g} != {d})"
                )
        if samples is None:
            samples = a.shape[0]
        elif a.shape[0] != samples:
            raise UserError(
                f"inputs in {p.name} disagree on the number of samples ({samples} vs {a.shape[0]})"
            )
        arrays[spec.name] = np.ascontiguousarray(a)
    return InputSet(arrays, {"kind": "file", "file": str(p.resolve()), "samples": samples})
