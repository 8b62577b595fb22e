"""What to run a model with when it does not say: a suggestion for every
dynamic dim and for inputs that need a real value (a sample rate).

A real model's inputs rarely come fully shaped. Filling every unknown dim with 1
makes image models fail deep inside the engine (`1x3x1x1` cannot pass a stride-2
convolution stack) and a random sample rate is meaningless, so instead the user
gets one error that names every dim at once and a suggestion built from, in
order: the model's metadata (`imgsz`, `input_shape`), the dims' names (`batch`,
`height`, `sequence`), the layout (NCHW images, audio next to a sample rate),
and a small probe: one unfused run on the reference it is handed that checks
the suggestion actually runs, trying a few larger sizes if it does not.

`resolve_shapes` lives here, not in inputs.py: the exact inputs are made from
its shapes, and its error is this module's suggestion.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from bisect_tui.core.errors import UserError
from bisect_tui.core.inputs import InputValue, generate_inputs, usable_dim_name, value_text
from bisect_tui.core.model import InputSpec, ModelInfo

if TYPE_CHECKING:
    from bisect_tui.api.reference import UnfusedReference

BATCH_NAMES = {"batch", "batch_size", "batchsize", "bs", "n", "b", "num_batches"}
HEIGHT_NAMES = {"height", "h", "img_h", "image_height", "in_h"}
WIDTH_NAMES = {"width", "w", "img_w", "image_width", "in_w"}
CHANNEL_NAMES = {"channels", "channel", "c", "num_channels"}
SEQ_NAMES = {"seq", "sequence", "seq_len", "seqlen", "sequence_length", "len", "length", "tokens",
             "num_tokens", "time", "t", "frames", "num_frames", "samples", "num_samples", "steps"}
SAMPLE_RATE_NAMES = {"sr", "sample_rate", "sampling_rate", "samplerate", "fs", "rate"}
IMAGE_SIDE = 224  # divisible by 32: passes the stride-32 stacks of detectors and classifiers
AUDIO_CHUNK = 512  # one VAD/ASR chunk at 16 kHz
TEXT_LEN = 16
PROBE_MAX_BYTES = 1 << 30  # above this the probe would cost real time: skipped


class InputsNeedValues(UserError):
    """The one-line error, with the suggestion kept for the app's settings form."""

    def __init__(self, text: str, suggestion: "Suggestion"):
        super().__init__(text)
        self.suggestion = suggestion


@dataclass
class DynamicDim:
    input: str
    axis: int
    name: Optional[str]  # a usable dim name, or None for '?', '-1' and unnamed dims


@dataclass
class Suggestion:
    """Concrete shapes and fixed values to try, with the reason for each guess."""

    shapes: dict[str, list[int]] = field(default_factory=dict)
    values: dict[str, InputValue] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    probe: Optional[str] = None  # "ran", "skipped: ..." or the error of the last try

    def flags(self) -> list[str]:
        out = [f"--shape {n}={'x'.join(map(str, d))}" for n, d in self.shapes.items()]
        out += [f"--input-value {n}={value_text(v)}" for n, v in self.values.items()]
        return out


_PLACEHOLDER = re.compile(r"^(p2o\.)?dynamicdimension[._]?\d*$|^unk__\d+$|^dim_?\d*$|^\d+$", re.I)


def placeholder(name: object) -> bool:
    """An exporter's made-up name (`p2o.DynamicDimension.0`, `unk__12`): it says nothing."""
    return not usable_dim_name(name) or bool(_PLACEHOLDER.match(str(name).strip()))


def short_shape(spec: InputSpec) -> str:
    """The shape with placeholder names shown as '?' (they only make it unreadable)."""
    parts = [str(d) if isinstance(d, int) else ("?" if placeholder(d) else str(d)) for d in spec.shape]
    sep = "x" if all(p.isdigit() or p == "?" for p in parts) else " x "
    return sep.join(parts) or "scalar"


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", name.strip().lower())


def dynamic_dims(info: ModelInfo, shapes: dict[str, list[int]]) -> list[DynamicDim]:
    """Every dim that has no value yet from the model or the user's --shape."""
    out = []
    for spec in info.inputs:
        if spec.name in shapes:
            continue
        for axis, d in enumerate(spec.shape):
            if isinstance(d, int):
                continue
            if usable_dim_name(d) and d in shapes and len(shapes[d]) == 1:
                continue
            out.append(DynamicDim(spec.name, axis, d if usable_dim_name(d) else None))
    return out


def needs_value(info: ModelInfo) -> list[InputSpec]:
    """Integer inputs that are configuration, not data (a sample rate): random
    integers would make the model compute nonsense or fail inside the engine."""
    return [s for s in info.inputs
            if s.dtype.startswith(("int", "uint")) and len(s.shape) <= 1
            and _norm(s.name) in SAMPLE_RATE_NAMES]


def resolve_shapes(info: ModelInfo, shapes: dict[str, list[int]],
                   values: Optional[dict[str, InputValue]] = None,
                   reference: Optional["UnfusedReference"] = None) -> dict[str, list[int]]:
    """Concrete shape of every input. Dynamic dims without a value are one error
    naming every one of them, with a suggestion (that ran on `reference`, when given)."""
    known = {s.name for s in info.inputs}
    dim_names = {d for s in info.inputs for d in s.shape if usable_dim_name(d)}
    for key in shapes:
        if key not in known and key not in dim_names:
            raise UserError(
                f"--shape names {key!r}, which is neither an input ({', '.join(sorted(known))})"
                + (f" nor a dim name ({', '.join(sorted(dim_names))})" if dim_names else "")
            )
    out: dict[str, list[int]] = {}
    for spec in info.inputs:
        if spec.name in shapes:
            given = shapes[spec.name]
            if len(given) != len(spec.shape):
                raise UserError(
                    f"--shape {spec.name}={'x'.join(map(str, given))} has rank {len(given)}, "
                    f"but the model's input has rank {len(spec.shape)} ({spec.shape_text()})"
                )
            for axis, (g, d) in enumerate(zip(given, spec.shape)):
                if isinstance(d, int) and d != g:
                    raise UserError(
                        f"--shape {spec.name}: axis {axis} is fixed to {d} in the model, got {g}"
                    )
            out[spec.name] = list(given)
            continue
        dims = []
        for axis, d in enumerate(spec.shape):
            if isinstance(d, int):
                dims.append(d)
            elif isinstance(d, str) and usable_dim_name(d) and d in shapes and len(shapes[d]) == 1:
                dims.append(shapes[d][0])
            else:
                dims.append(None)
        out[spec.name] = dims
    missing = [(n, axis) for n, dims in out.items() for axis, d in enumerate(dims) if d is None]
    if missing:
        raise dynamic_inputs_error(info, shapes, values or {}, reference)
    return out


def _metadata(info: ModelInfo) -> dict[str, list[int]]:
    out = {}
    for p in info.model.metadata_props:
        nums = [int(x) for x in re.findall(r"-?\d+", p.value or "")]
        if nums and len(nums) <= 8:
            out[_norm(p.key)] = nums
    return out


def image_words(shape, dims, nchw: bool, guessed: set[int]) -> str:
    """What the suggested image input is, as the whole shape says: ddddocr's
    1x1x64xW was "a 224x224 image" when it is a 64-high grayscale text line."""
    h, w, c = (2, 3, shape[1]) if nchw else (1, 2, shape[3])
    kind = {1: "a grayscale ", 3: "an RGB "}.get(c if isinstance(c, int) else dims[1 if nchw else 3], "an ")
    text = f"{kind}image {dims[h]} high, {dims[w]} wide"
    if len(guessed & {h, w}) == 1:
        side, fixed = ("height", dims[h]) if h not in guessed else ("width", dims[w])
        text += f", its {side} fixed by the model"
        if side == "height" and fixed <= 64:
            text += ": a text line, whose width is its length (any width fits)"
    return text


def suggest(info: ModelInfo, shapes: dict[str, list[int]], values: dict[str, InputValue]) -> Suggestion:
    """A concrete shape for every input with a dynamic dim, and values for config inputs."""
    sug = Suggestion()
    meta = _metadata(info)
    has_rate = any(_norm(s.name) in SAMPLE_RATE_NAMES for s in info.inputs)
    named: dict[str, int] = {}  # dim name -> value, so a shared name gets one value
    why: dict[str, str] = {}
    missing = {(d.input, d.axis) for d in dynamic_dims(info, shapes)}
    imgsz = meta.get("imgsz") or meta.get("image_size") or meta.get("img_size") or meta.get("input_size")
    for spec in info.inputs:
        axes = [a for a in range(len(spec.shape)) if (spec.name, a) in missing]
        if not axes:
            continue
        dims = list(shapes.get(spec.name) or [])
        if not dims:
            dims = [d if isinstance(d, int) else (shapes[d][0] if usable_dim_name(d) and d in shapes else None)
                    for d in spec.shape]
        rank = len(spec.shape)
        from_meta = meta.get(f"{_norm(spec.name)}_shape") or meta.get("input_shape") or meta.get("shape")
        nchw = rank == 4 and spec.shape[1] in (1, 3)
        nhwc = rank == 4 and spec.shape[3] in (1, 3) and not nchw
        floaty = spec.dtype.startswith(("float", "bfloat"))
        guessed: set[int] = set()  # image sides given IMAGE_SIDE
        for a in axes:
            raw = spec.shape[a]
            name = "" if placeholder(raw) else _norm(raw)
            if usable_dim_name(raw) and raw in named:
                dims[a] = named[raw]
                continue
            if from_meta and len(from_meta) == rank and from_meta[a] > 0:
                v, reason = from_meta[a], "from the model's metadata"
            elif name in BATCH_NAMES or (a == 0 and rank >= 2 and not name):
                v, reason = 1, "batch of 1"
            elif name in CHANNEL_NAMES:
                v, reason = 3, "3 channels"
            elif name in HEIGHT_NAMES or name in WIDTH_NAMES or ((nchw and a in (2, 3)) or (nhwc and a in (1, 2))):
                side = 0 if (name in HEIGHT_NAMES or (nchw and a == 2) or (nhwc and a == 1)) else 1
                if imgsz:
                    v, reason = imgsz[min(side, len(imgsz) - 1)], "image size from the model's metadata"
                else:
                    v, reason = IMAGE_SIDE, None  # worded below from the whole shape
                    guessed.add(a)
            elif not name and 0 < a < rank - 1 and not (nchw or nhwc):
                v, reason = 1, "batch of 1"  # states and hidden tensors keep the batch in the middle
            elif floaty and has_rate and (name in SEQ_NAMES or not name):
                v, reason = AUDIO_CHUNK, f"{AUDIO_CHUNK} audio samples (a 16 kHz chunk)"
            elif name in SEQ_NAMES:
                v, reason = TEXT_LEN, f"sequence of {TEXT_LEN}"
            else:
                v, reason = TEXT_LEN, f"{TEXT_LEN} (no hint in the model)"
            dims[a] = v
            if usable_dim_name(raw):
                named[raw] = v
            if reason is not None:
                why.setdefault(reason, reason)
        if guessed:
            words = image_words(spec.shape, dims, nchw, guessed)
            why.setdefault(words, words)
        sug.shapes[spec.name] = dims
    for spec in needs_value(info):
        if spec.name not in values:
            sug.values[spec.name] = 16000
            why.setdefault(f"{spec.name}: 16 kHz", f"{spec.name}=16000 Hz")
    sug.reasons = list(why.values())
    return sug


# tried in order when the first guess does not run: text-line OCR (48x320), big detectors
IMAGE_ALTERNATIVES = ((48, 320), (640, 640))
_ALTERNATIVES = {AUDIO_CHUNK: (1024, 1536), TEXT_LEN: (64, 128)}


def probe_suggestion(info: ModelInfo, sug: Suggestion, shapes: dict[str, list[int]],
                     values: dict[str, InputValue], reference: "UnfusedReference", tries: int = 3) -> Suggestion:
    """Run the suggestion once unfused on `reference`; on failure try a few larger
    guessed sizes. Fills `sug.probe`; keeps the first suggestion that ran."""
    if info.initializer_bytes > PROBE_MAX_BYTES:
        sug.probe = "skipped: the model is large"
        return sug
    from bisect_tui.core.groups import open_session

    try:
        sess = open_session(reference, info.model)
    except UserError as exc:
        sug.probe = str(exc)
        return sug
    names = sess.output_names()
    dyn = {(d.input, d.axis) for d in dynamic_dims(info, shapes)}
    specs = {s.name: s for s in info.inputs}

    def image_axes(n: str) -> tuple[int, int] | None:
        sh = specs[n].shape
        if len(sh) == 4 and sh[1] in (1, 3):
            return 2, 3
        if len(sh) == 4 and sh[3] in (1, 3):
            return 1, 2
        return None

    candidates = [sug.shapes]
    for k in range(2):
        alt = {}
        for n, dims in sug.shapes.items():
            dims = list(dims)
            ia = image_axes(n)
            for a, v in enumerate(dims):
                if (n, a) not in dyn:
                    continue
                if ia and a in ia and v == IMAGE_SIDE:
                    dims[a] = IMAGE_ALTERNATIVES[k][ia.index(a)]
                elif v in _ALTERNATIVES:
                    dims[a] = _ALTERNATIVES[v][k]
            alt[n] = dims
        if alt not in candidates:
            candidates.append(alt)
    last = ""
    for cand in candidates[:tries]:
        try:
            full = resolve_shapes(info, {**shapes, **cand})
            feeds = generate_inputs(info, full, 0, 1, values={**values, **sug.values}).feeds(0)
            sess.run(names, feeds)
        except Exception as exc:  # the engine's own words, first line only
            last = reference.error_text(exc)[:160]
            continue
        if cand is not sug.shapes:
            sizes = sorted({"x".join(str(cand[n][a]) for a in image_axes(n)) for n in cand if image_axes(n)})
            sug.reasons = [r for r in sug.reasons if "image" not in r and "audio" not in r and "sequence" not in r]
            sug.reasons.append((f"a {', '.join(sizes)} image" if sizes else "larger sizes")
                               + ": the first guess did not run")
        sug.shapes = cand
        sug.probe = "ran"
        return sug
    sug.probe = last or "did not run"
    return sug


def dynamic_inputs_error(info: ModelInfo, shapes: dict[str, list[int]], values: dict[str, InputValue],
                         reference: Optional["UnfusedReference"] = None) -> "InputsNeedValues":
    """One line naming every dynamic dim (and config input without a value), then a
    suggestion the user can paste (checked by a probe on `reference`, when given)."""
    dims = dynamic_dims(info, shapes)
    by_input: dict[str, list[DynamicDim]] = {}
    for d in dims:
        by_input.setdefault(d.input, []).append(d)
    specs = {s.name: s for s in info.inputs}
    parts = []
    for name, ds in by_input.items():
        where = ", ".join(f"axis {d.axis} " + (f"'{d.name}'" if d.name else "(unnamed)") for d in ds)
        parts.append(f"'{name}' ({short_shape(specs[name])}: {where})")
    config = [s for s in needs_value(info) if s.name not in values]
    text = ""
    if parts:
        n = len(dims)
        text = f"{n} dynamic dim{'s' if n != 1 else ''} without a value in input{'s' if len(parts) > 1 else ''} " \
               + "; ".join(parts)
    if config:
        text += ("; and " if text else "") + ", ".join(
            f"'{s.name}' ({s.dtype} {short_shape(s)}) looks like a sample rate that random integers would get wrong"
            for s in config)
    sug = suggest(info, shapes, values)
    if reference is not None:
        sug = probe_suggestion(info, sug, shapes, values, reference)
    ran = f"; it ran in a quick probe on {reference.label}" if reference is not None and sug.probe == "ran" else ""
    if sug.probe and sug.probe != "ran":
        ran = (f"; it did not run in a quick probe: {sug.probe}" if not sug.probe.startswith("skipped")
               else f"; probe {sug.probe}")
    hint = " ".join(sug.flags())
    reasons = "; ".join(sug.reasons)
    return InputsNeedValues(f"{text}. Try: {hint} ({reasons}{ran}); or give real inputs with --input FILE.npz", sug)


def check_config_inputs(info: ModelInfo, values: dict[str, InputValue],
                        ranges: dict[str, tuple[float, float]]) -> None:
    """Refuse to guess a sample rate: the error says which value to pass."""
    missing = [s for s in needs_value(info) if s.name not in values and s.name not in ranges]
    if missing:
        raise InputsNeedValues(
            ", ".join(f"input '{s.name}' ({s.dtype} {s.shape_text()}) looks like a sample rate; random "
                      f"integers would be meaningless" for s in missing)
            + ". Give it with " + " ".join(f"--input-value {s.name}=16000" for s in missing)
            + " (or the rate your data has)", Suggestion(values={s.name: 16000 for s in missing},
                                                          reasons=["looks like a sample rate"]))
