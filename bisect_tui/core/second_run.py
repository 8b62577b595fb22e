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


def main(argv: list[str]) -> int:
    import numpy as np

    from bisect_tui.core.checks import HashSink
    from bisect_tui.core.inputs import InputSet
    from bisect_tui.core.model import load_model_info
    from bisect_tui.core.runner import model_sizes, run_groups
    from bisect_tui.core.session import Session

    session = Session(Path(argv[0]))
    with open(argv[1], encoding="utf-8") as fh:
        plan = json.load(fh)
    info = load_model_info(session.model_path)
    with np.load(session.inputs_path, allow_pickle=False) as z:
        inputs = InputSet({k: z[k] for k in z.files}, {})
    _, types = model_sizes(info, plan["shapes"])
    sink = HashSink()

    def progress(p) -> None:
        print(json.dumps({"progress": p.message, "done": p.done, "total": p.total}), flush=True)

    run_groups(info.model, plan["groups"], inputs, sink, types, None, progress, "determinism")
    print(json.dumps({"digests": sink.digests}), flush=True)
    return 0


if __name__ == "__main__":
    from bisect_tui.core.errors import UserError

    try:
        raise SystemExit(main(sys.argv[1:]))
    except UserError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        raise SystemExit(2)
