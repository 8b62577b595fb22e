"""The garbage collector is paused while a `check` or `bisect` imports its libraries.

Importing numpy, onnx, the engine's library and this tool creates a few hundred
thousand objects; the collector runs every 700 allocations and each full pass
walks all of them again, none of which is garbage. Measured on a 109-node
`bisect` (median of 7 alternating runs, issue 20's "no slower"): 0.45 s of CPU
with the collector running through the imports, 0.42 s paused and then frozen.

`pause()` is called by the console entry (cli.entry) as a check or bisect
starts, `imports_done()` once its modules are loaded (before the model is read):
the collector runs again from then on, and what the imports made is moved out of
its sight for good (`gc.freeze`), so the search's own collections no longer walk
it either. `resume()` in main's `finally` covers a command that failed before
its imports were done. main() called in-process (the tests, many times in one
process) is never paused, so it never freezes another run's leftovers.
"""

from __future__ import annotations

import gc

_PAUSED = []


def pause() -> None:
    if gc.isenabled():
        gc.disable()
        _PAUSED.append(True)


def imports_done() -> None:
    if _PAUSED:
        _PAUSED.clear()
        gc.freeze()
        gc.enable()


def resume() -> None:
    if _PAUSED:
        _PAUSED.clear()
        gc.enable()
