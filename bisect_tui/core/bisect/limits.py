"""How much parallelism the search accepts.

Each worker is a process holding a whole engine and its builds: past a few per
core they only fight over the CPU and memory (`--workers 100000` once tried to
start 99,999 processes). Ray's actors live on a cluster: their own cap.
"""

from __future__ import annotations

MAX_LOCAL_PER_CORE = 4
MAX_LOCAL = 64
MAX_RAY = 256
MAX_FANOUT = 64


def check_parallelism(workers: int, fanout: int, ray: bool) -> None:
    """Refuse (exit 2, before any work) more workers or split points than can help."""
    from bisect_tui.core.errors import UserError
    from bisect_tui.core.threads import cores

    if ray:
        if workers > MAX_RAY:
            raise UserError(f"--workers {workers}: at most {MAX_RAY} Ray actors (docs/bisect.md)")
    else:
        n = cores()
        cap = min(MAX_LOCAL, MAX_LOCAL_PER_CORE * n)
        if workers > cap:
            raise UserError(f"--workers {workers}: at most {cap} local worker processes on this machine "
                            f"({n} core(s), {MAX_LOCAL_PER_CORE} per core, each holding a whole engine); "
                            "use --ray ADDRESS to build on more machines")
    if fanout > MAX_FANOUT:
        raise UserError(f"--fanout {fanout}: at most {MAX_FANOUT} split points a round (docs/bisect.md)")


def build_memory(triage) -> tuple[int, int, int]:
    """(one whole-graph build's footprint, what this process holds now, how many such
    builds fit at once within the memory budget): core/memory.py's estimate for this
    model, its weights and the baseline's tensors (every one of them a graph output in
    "all fusions blocked"), against `--max-memory` (default: a quarter of free RAM)."""
    from bisect_tui.core.memory import build_footprint, builds_that_fit, process_floor

    info = triage.info
    manifest = getattr(getattr(triage, "baseline", None), "manifest", None) or {}
    samples = max(getattr(triage.inputs, "samples", 1) or 1, 1)
    if manifest.get("bytes") is not None:
        activations = int(manifest["bytes"]) // max(int(manifest.get("samples") or 1), 1) * samples
    else:  # before the dump: shape inference's sizes (unknown dims count as nothing)
        activations = _activation_bytes(info, getattr(triage, "shapes", {}) or {}) * samples
    footprint = build_footprint(info.node_count, info.initializer_bytes, activations)
    held = process_floor()
    return footprint, held, builds_that_fit(triage.max_memory, held, footprint)


def _activation_bytes(info, shapes: dict) -> int:
    from bisect_tui.core.groups import model_sizes

    sizes, _ = model_sizes(info, shapes)
    return sum(v or 0 for v in sizes.values())


def builds_beside_fit(triage, builds: int = 2) -> bool:
    """A build may start beside another one (a prefetch, an early build) only when both
    (`builds` at once) fit in the memory budget: what makes the peak of a search grow
    with its overlaps."""
    try:
        return build_memory(triage)[2] >= builds
    except Exception:  # noqa: BLE001 - no model or baseline yet: nothing to overlap with
        return False


def precheck_build_memory(opts) -> None:
    """check_build_memory before any work, for a `--max-memory` given: the model alone
    (its nodes, weights and the sizes shape inference gives), so a budget the search
    cannot keep stops the command before the dump instead of after it."""
    if not opts.max_memory:
        return
    from types import SimpleNamespace

    from bisect_tui.core.model import load_model_info

    check_build_memory(SimpleNamespace(opts=opts, info=load_model_info(opts.model), baseline=None, inputs=None,
                                       shapes=dict(opts.shapes or {}), max_memory=opts.max_memory))


def check_build_memory(triage, workers: int = 1) -> None:
    """Refuse (exit 2, one line) a `--max-memory` the search cannot keep: less than one
    whole-graph build beside what the process holds, or than one per local worker.
    The default budget is not refused: it only decides what overlaps (builds_beside_fit)."""
    from bisect_tui.core.errors import UserError
    from bisect_tui.core.memory import MB

    if not triage.opts.max_memory:
        return
    footprint, held, fit = build_memory(triage)
    need = max(1, workers)
    if fit < need:
        # what the process holds counts freed memory the allocator kept (the float64 arbiter's
        # arrays: 1.8 GB held at 21,000 nodes under --max-memory 2G): given back, then measured again
        from bisect_tui.core.memory import release_memory

        release_memory()
        footprint, held, fit = build_memory(triage)
    if fit >= need:
        return
    what = "one whole-graph build" if need == 1 else f"{need} whole-graph builds at once (--workers {need})"
    raise UserError(f"--max-memory {triage.opts.max_memory / MB:.0f}M is below what {what} of this model "
                    f"needs beside the {held / MB:.0f} MB this process holds (about {footprint / MB:.0f} MB "
                    f"each): give at least --max-memory {(held + need * footprint) // MB + 1}M")
