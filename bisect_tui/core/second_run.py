"""The determinism check's second baseline run, in a fresh process.

Two runs in one process share what a process holds once: ONNX Runtime's
random seed for unseeded RandomNormal/Dropout, thread pools, allocator state.
An unseeded random op then gives the same values twice and the baseline is
declared deterministic, so a later run "finds" a fusion failure that is only
noise. The second run is therefore this module's `main`, started as
`python -m bisect_tui.core.second_run SESSION PLAN.json`: it reads the
session's prepared model and exact inputs, runs the planned groups, and prints
one JSON line per group (progress) and a last line with every tensor's SHA-256.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def prestart() -> None:
    """Start the second run's interpreter now, before this process has even
    imported its libraries: it imports numpy, onnx and ONNX Runtime while this
    one does, then waits on its stdin for the session and plan (SecondRun hands
    them over). Unused, it exits when this process does (its stdin closes)."""
    import subprocess

    from bisect_tui.core.threads import cores

    if cores() < 2 or _PRESTARTED:
        return  # one core: the child would only slow this process down
    try:
        proc = subprocess.Popen([sys.executable, "-m", "bisect_tui.core.second_run", "--stdin"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=child_env())
    except OSError:
        return  # SecondRun starts its own when the time comes
    _PRESTARTED.append(proc)


_PRESTARTED: list = []


def child_env() -> dict:
    """This process's environment for the second run, BLAS threads limited (threads.py)."""
    import os

    from bisect_tui.core.threads import limit_blas

    return dict(limit_blas(dict(os.environ)))


def take_prestarted():
    """The waiting interpreter, if one is still alive (else None)."""
    while _PRESTARTED:
        proc = _PRESTARTED.pop()
        if proc.poll() is None:
            return proc
    return None


def main(argv: list[str]) -> int:
    import numpy as np

    from bisect_tui.core.checks import HashSink
    from bisect_tui.core.inputs import InputSet
    from bisect_tui.core.runner import run_groups
    from bisect_tui.core.session import Session

    if argv == ["--stdin"]:
        import onnxruntime  # noqa: F401  (imported while waiting, not after)

        line = sys.stdin.readline()
        if not line.strip():
            return 0  # not needed after all
        argv = json.loads(line)
    session = Session(Path(argv[0]))
    with open(argv[1], encoding="utf-8") as fh:
        plan = json.load(fh)
    model = _load_prepared(session.model_path)
    with np.load(session.inputs_path, allow_pickle=False) as z:
        inputs = InputSet({k: z[k] for k in z.files}, {})
    sink = HashSink()

    def progress(p) -> None:
        print(json.dumps({"progress": p.message, "done": p.done, "total": p.total}), flush=True)

    # marked untyped (types=None): ORT types each output from its node, so this
    # process needs no shape inference of its own
    run_groups(model, plan["groups"], inputs, sink, None, None, progress, "determinism")
    print(json.dumps({"digests": sink.digests}), flush=True)
    truth = plan.get("truth")
    if truth:
        _float64_truth(model, inputs, truth["outputs"], truth["file"])
    return 0


def _load_prepared(path: Path):
    """The session's prepared model, which the parent checked and wrote: read,
    not checked and indexed again (the checker, the index and the shape
    inference were a quarter of this process's work on a 5,000-node model).
    ONNX Runtime still validates it when the session is made."""
    import onnx

    from bisect_tui.core.errors import UserError

    try:
        return onnx.load(str(path), load_external_data=True)
    except Exception as exc:  # noqa: BLE001 - protobuf's errors: one line for the parent
        text = (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]
        raise UserError(f"the second run could not read the session's model: {text}") from None


def _float64_truth(model, inputs, outputs: list[str], dest: str) -> None:
    """The arbiter's float64 run of the whole model (it needs no engine), while
    the parent judges the engine; the arrays go to `dest` (in the session's tmp/),
    one line says what computed them."""
    import os

    import numpy as np

    from bisect_tui.core.errors import UserError
    from bisect_tui.core.reference import float64_outputs

    try:
        arrays, ran_with, fallback_reason = float64_outputs(model, inputs, outputs)
    except UserError as exc:
        print(json.dumps({"truth_error": str(exc)}), flush=True)
        return
    part = dest + ".part"
    with open(part, "wb") as fh:
        np.savez(fh, **{f"o{i}": arrays[n] for i, n in enumerate(outputs)})
    os.replace(part, dest)
    print(json.dumps({"truth": {"ran_with": ran_with, "fallback_reason": fallback_reason}}), flush=True)


def _exit_now(code: int) -> None:
    """Everything this process owes is on stdout (flushed): exit without tearing
    down ONNX Runtime and the model, 40 ms the parent would otherwise wait for."""
    import os

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(code)


if __name__ == "__main__":
    from bisect_tui.core.errors import UserError

    try:
        code = main(sys.argv[1:])
    except UserError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        _exit_now(2)
    _exit_now(code)
