"""Work started in a thread beside other work of this process.

For calls that spend their time in a library that lets go of the GIL (an ONNX
Runtime session being created or run): the checklist builds the engine under
test while the baseline dumps, the search builds the next certain candidate
while it judges a subgraph. The caller takes the Future's result where the work
would otherwise have been done, so errors surface in the same place.
"""

from __future__ import annotations

import atexit
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable


def start(fn: Callable[..., Any], *args: Any, name: str, nice: int = 0) -> Future:
    """`fn(*args)` in its own thread (named `name-N` in tracebacks and logs).

    `nice`: how much lower that thread runs than the others (a guess that should only
    take what the certain work leaves); its own threads, such as a runtime's pool, are
    created lower too."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return pool.submit(_lowered, nice, fn, *args) if nice > 0 else pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)  # the thread ends with its one task


def lower_priority(nice: int, tid: int = 0) -> None:
    """Thread `tid` (0: the calling one; on Linux a priority is a thread's, and the
    threads it makes from then on inherit it) `nice` steps lower; nothing where the
    platform or the permissions do not allow it (it then runs at the same priority)."""
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except (AttributeError, OSError):
        pass


def _lowered(nice: int, fn: Callable[..., Any], *args: Any) -> Any:
    lower_priority(nice, threading.get_native_id())  # the thread ends with the task
    return fn(*args)


# how long a caller waits for a build it started to reach the engine's library
# (BuildContext.entered, Capabilities.concurrent_builds) before its own next work, which
# may hold the GIL; ORT got there in 0.02 s at 21,000 nodes when nothing held it
ENTRY_WAIT_S = 0.5


def wait_for_entry(future: Future, entered: threading.Event) -> None:
    """Return once `entered` is set (by the build, as the library takes over), the build
    has ended, or ENTRY_WAIT_S has passed: a build that never says so costs that much."""
    future.add_done_callback(lambda _f: entered.set())
    entered.wait(ENTRY_WAIT_S)


def done(value: Any) -> Future:
    """A Future that already holds `value` (work made some other way)."""
    f: Future = Future()
    f.set_result(value)
    return f


# Closes put off until this process's search next waits on a build. Tearing down
# a runtime session holds the GIL: the engine under test's and the probe's took
# 0.3 s of the main thread at 21,000 nodes between the check and round 1's first
# build, which waited for it. Each runs once, in the order given. Only closes that
# give memory back belong here (no files, no locks): a process about to end may
# leave them undone (exit_soon).
_LATER: list[Callable[[], None]] = []
_LATER_LOCK = threading.Lock()
# what a command's last run_later left undone in a process that ends next: kept
# referenced, so no teardown runs before the exit
_LEFT: list[Callable[[], None]] = []
_EXIT_SOON: list[bool] = []


def close_later(close: Callable[[], None]) -> None:
    """Run `close` at the next `run_later` (a wait), or at exit at the latest."""
    with _LATER_LOCK:
        _LATER.append(close)


def exit_soon() -> None:
    """This process ends with os._exit once its command returns (the console script,
    cli.entry): the command's last closes would only give memory back to a process
    that is gone a moment later (0.16-0.25 s of the tail at 21,000 nodes, the search's
    last engines torn down while nothing else was left to do)."""
    _EXIT_SOON.append(True)


def run_later(last: bool = False) -> None:
    """Every close put off so far, now (the caller is about to wait anyway).

    `last`: the command's end; in a process that ends next (exit_soon) the closes
    are left to the exit instead."""
    if last and _EXIT_SOON:
        with _LATER_LOCK:
            _LEFT.extend(_LATER)
            _LATER.clear()
        return
    while True:
        with _LATER_LOCK:
            if not _LATER:
                return
            close = _LATER.pop(0)
        close()


atexit.register(run_later)
