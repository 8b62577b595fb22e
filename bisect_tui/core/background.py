"""Work started in a thread beside other work of this process.

For calls that spend their time in a library that lets go of the GIL (an ONNX
Runtime session being created or run): the checklist builds the engine under
test while the baseline dumps, the search builds the next certain candidate
while it judges a subgraph. The caller takes the Future's result where the work
would otherwise have been done, so errors surface in the same place.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable


def start(fn: Callable[..., Any], *args: Any, name: str) -> Future:
    """`fn(*args)` in its own thread (named `name-N` in tracebacks and logs)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)  # the thread ends with its one task


def done(value: Any) -> Future:
    """A Future that already holds `value` (work made some other way)."""
    f: Future = Future()
    f.set_result(value)
    return f
