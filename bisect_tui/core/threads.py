"""How many threads numpy's BLAS may use in this tool's processes.

OpenBLAS (and MKL) threads spin between calls. On a two-core machine the
spinning took the core that an engine build, the second run or this process's
own Python was using (a 1,000-node CNN's bisection ran 5-10% faster with one
BLAS thread: the float64 truth's convolutions, the metrics' dot products). So
each process gets one fewer than the cores, at least one, unless the user set
the variable. It must be in the environment before numpy loads its BLAS.
"""

from __future__ import annotations

import os
from typing import MutableMapping

# the BLAS libraries numpy may load; each reads its own variable once, at load
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def cores() -> int:
    """The cores this process may run on (its affinity, which a container or
    `taskset` narrows), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def limit_blas(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """`env` with each BLAS thread count set to cores - 1 where the user left it unset."""
    for var in BLAS_THREAD_VARS:
        env.setdefault(var, str(max(1, cores() - 1)))
    return env
