"""The garbage collector is paused while a `check` or `bisect` imports its libraries.

Importing numpy, onnx, the engine's library and this tool creates a few hundred
thousand objects; the collector runs every 700 allocations and each full pass
walks all of them again, none of which is garbage. Measured on a 109-node
`bisect` (median of 7 alternating runs, issue 20's "no slower"): 0.45 s of CPU
with the collector running through the imports, 0.42 s paused and then frozen.

Then the collector runs with larger thresholds (THRESHOLDS, below).

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

_paused = False


def pause() -> None:
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


# After the imports: a young generation of 50,000 objects (700 by default) and fewer
# older passes. A bisection's own objects (records of every tensor and node, the maps
# of each build) are long-lived too, and the default thresholds walked them again and
# again: ln0_20000 (21,000 nodes, bisect, one process tree) took 37.2 s of CPU and 22.1 s
# of wall with the default, 34.0 and 20.4 s with these, 32.6 and 19.4 s with no collector
# at all. Cyclic garbage still goes, at most 50,000 container objects later.
THRESHOLDS = (50_000, 20, 20)


def imports_done() -> None:
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.set_threshold(*THRESHOLDS)
        gc.enable()


def resume() -> None:
    global _paused
    if _paused:
        _paused = False
        gc.enable()
