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
