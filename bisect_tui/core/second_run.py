"""The determinism check's second baseline run, in a fresh process.

Two runs in one process share what a process holds once: the unfused
library's random seed for unseeded RandomNormal/Dropout, thread pools,
allocator state. An unseeded random op then gives the same values twice and
the baseline is declared deterministic, so a later run "finds" a fusion
failure that is only noise. The second run is therefore this module's
`main`, started as `python -m bisect_tui.core.second_run SESSION PLAN.json
REFERENCE`: it makes the reference again from its spec, reads the session's
prepared model and exact inputs, runs the planned groups, and prints one JSON
line per group (progress) and a last line with every tensor's SHA-256.
`SecondRun` is this process's side: it starts the child, hands it the plan
and reads its lines.
"""

from __future__ import annotations

import hashlib
import json
import queue
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from bisect_tui.core.cancel import CancelToken, Progress, ProgressFn, no_progress
from bisect_tui.core.errors import UserError

if TYPE_CHECKING:
    import numpy as np

    from bisect_tui.api.reference import UnfusedReference
    from bisect_tui.core.session import Session


def prestart(reference_spec: Optional[str] = None) -> None:
    """Start the second run's interpreter now, before this process has even
    imported its libraries: it imports numpy, onnx and the reference's library
    (`reference_spec`, see `load_reference`) while this one does, then waits on
    its stdin for the session and plan (SecondRun hands them over). Unused, it
    exits when this process does (its stdin closes)."""
    import subprocess

    from bisect_tui.core.threads import cores

    if cores() < 2 or _PRESTARTED:
        return  # one core: the child would only slow this process down
    try:
        proc = subprocess.Popen([sys.executable, "-m", "bisect_tui.core.second_run", "--stdin",
                                 *([reference_spec] if reference_spec else [])],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=child_env())
    except OSError:
        return  # SecondRun starts its own when the time comes
    _PRESTARTED.append(proc)


_PRESTARTED: list = []


def stop_prestarted() -> None:
    """End the waiting interpreters nobody took, at once: one that was never
    handed a plan holds nothing (it has only been importing), and waiting for
    its imports to finish made every early refusal a second slower. No process
    outlives the command."""
    while _PRESTARTED:
        _discard(_PRESTARTED.pop())


def _discard(proc) -> None:
    """A waiting interpreter nobody will use: killed, reaped, its pipes closed."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass


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
        _discard(proc)  # it died waiting: its pipes are closed here, not left to the exit
    return None


_LIVE: "set[SecondRun]" = set()


def abort_all() -> None:
    """Every second run still alive is stopped and reaped: called before the
    session's temp folder is swept, so no child writes into it afterwards (an
    atexit abort came after the sweep and left a file there)."""
    for run in list(_LIVE):
        run.abort()


class SecondRun:
    """The baseline's groups run again in a new Python process (this module's
    `main`), which prints every tensor's SHA-256.

    It needs nothing from the first run, so it may start before the baseline
    dump and run beside it on another core; `collect` waits for its digests.
    Cancellable at any time; errors are one line."""

    def __init__(self, session: "Session", groups: list[list[str]], cancel: Optional[CancelToken],
                 truth_outputs: Optional[list[str]] = None, *, reference: "UnfusedReference",
                 cuts: tuple[str, ...] = ()):
        """`reference`: what the child runs the groups on (it makes its own from
        `reference.spec`). `truth_outputs`: after the digests, the child also runs
        the model in float64 (the arbiter's truth, which needs nothing from the
        engine) for these graph outputs, on its own core while this process judges
        the engine; `truth()` reads it. `cuts`: the child runs the graph in parts cut
        there (core/parted_run.py); `parts` says how many it made (0: one session)."""
        import atexit
        import os
        import subprocess
        import tempfile
        import threading

        from bisect_tui.core import atomic

        self.groups = groups
        self.cancel = cancel or CancelToken()
        tmp_dir = session.path("tmp")
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, self.plan_path = tempfile.mkstemp(prefix="determinism-plan-", suffix=".json", dir=tmp_dir)
        os.close(fd)
        self.truth_path = self.plan_path[: -len(".json")] + ".truth.npz"
        self.truth_outputs = list(truth_outputs) if truth_outputs else None
        plan: dict = {"groups": groups}  # the session holds the model and the exact inputs
        self.cuts = tuple(cuts)
        self.parts = 0
        if self.cuts:
            plan["cuts"] = list(self.cuts)
        if self.truth_outputs:
            plan["truth"] = {"outputs": self.truth_outputs, "file": self.truth_path}
        atomic.write_json(Path(self.plan_path), plan)
        cmd = [sys.executable, "-m", "bisect_tui.core.second_run", str(session.root), self.plan_path,
               reference.spec]
        try:
            waiting = take_prestarted()
            if waiting is not None:
                try:  # the interpreter started at launch: hand it this run
                    assert waiting.stdin is not None
                    waiting.stdin.write(json.dumps(cmd[-3:]) + "\n")
                    waiting.stdin.close()
                except (OSError, ValueError):
                    _discard(waiting)
                    waiting = None
            self.proc = waiting or subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                    text=True, stdin=subprocess.DEVNULL, env=child_env())
        except BaseException:
            self._unlink_plan()
            raise
        self._done = False
        # both pipes are drained from the start: a child started early must never
        # block on a full pipe while this process is still dumping
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.stderr_parts: list[str] = []

        def read_out() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.put(line)
            self.lines.put(None)

        def read_err() -> None:
            assert self.proc.stderr is not None
            self.stderr_parts.append(self.proc.stderr.read())

        def watch() -> None:  # a cancel stops the child even while it is silent
            while self.proc.poll() is None and not self._done:
                if self.cancel.cancelled:
                    self.proc.kill()
                    return
                time.sleep(0.05)

        atexit.register(self.abort)  # never an orphan, whatever stops this process
        _LIVE.add(self)
        self._readers = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
        for t in self._readers:
            t.start()
        threading.Thread(target=watch, daemon=True).start()

    def _unlink_plan(self) -> None:
        """The plan and the truth file go; also the truth's `.part` of a child
        killed while it wrote it (called once the child is reaped)."""
        import os

        for f in (self.plan_path, self.truth_path, self.truth_path + ".part"):
            try:
                os.unlink(f)
            except OSError:
                pass

    @property
    def truth_pending(self) -> bool:
        """The digests are in and the child is still working on the float64 truth."""
        return bool(self.truth_outputs) and not self._done

    def _next_message(self) -> Optional[dict]:
        """The child's next JSON line (None at its end or on cancel)."""
        while True:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.cancel.cancelled:
                    return None
                continue
            if line is None or self.cancel.cancelled:
                return None
            try:
                return json.loads(line)
            except ValueError:
                continue

    def truth(self) -> Optional[tuple[dict, Optional[str], Optional[str]]]:
        """(arrays by output name, what computed them, why the first evaluator did not)
        from the child; None when it gave none (it died: the caller computes it).
        A model with no float64 truth raises the child's one-line UserError."""
        if not self.truth_pending:
            return None
        msg = None
        try:
            while msg is None:
                m = self._next_message()
                if m is None:
                    break
                if "truth" in m or "truth_error" in m:
                    msg = m
            arrays = None
            if msg is not None and "truth" in msg:
                import numpy as np

                try:
                    with np.load(self.truth_path, allow_pickle=False) as z:
                        arrays = {n: z[f"o{i}"] for i, n in enumerate(self.truth_outputs or [])}
                except (OSError, ValueError, KeyError):
                    msg = None  # the file did not survive (a sweep, a full disk): computed here
        finally:
            self._end(kill=msg is None)
        self.cancel.check()
        if msg is None:
            return None
        if "truth_error" in msg:
            raise UserError(msg["truth_error"])
        from bisect_tui.core.reference import Truth, log_warnings

        t = msg["truth"]
        log_warnings(t.get("warnings") or [])
        return Truth.of(arrays, t.get("ran_with"), t.get("fallback_reason"), t.get("reference_check"),
                        t.get("warnings") or ())

    def abort(self) -> None:
        """Not needed after all (or the run around it failed): stop the child."""
        if not self._done:
            self._end(kill=True)

    def _end(self, kill: bool) -> str:
        """Done with the child: stopped first when `kill` (it still owes something
        nobody will read), then reaped; its stderr."""
        import atexit

        self._done = True
        atexit.unregister(self.abort)
        _LIVE.discard(self)
        if kill and self.proc.poll() is None:
            self.proc.kill()
        return self._finish()

    def _finish(self) -> str:
        self.proc.wait()
        for t in self._readers:
            t.join(timeout=10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        self._unlink_plan()
        return "".join(self.stderr_parts)

    def collect(self, progress: ProgressFn = no_progress) -> dict[str, str]:
        digests: Optional[dict] = None
        error = None
        stderr = ""
        try:
            while True:
                msg = self._next_message()
                if msg is None:
                    break
                if "progress" in msg:
                    progress(Progress("determinism", f"second run (fresh process): {msg['progress']}",
                                      msg.get("done", 0), msg.get("total", 0)))
                elif "digests" in msg:
                    digests = msg["digests"]
                    self.parts = int(msg.get("parts") or 0)
                    if self.truth_outputs:
                        break  # the child goes on with the float64 truth: truth() reads it
                elif "error" in msg:
                    error = msg["error"]
        finally:
            keep = digests is not None and bool(self.truth_outputs) and not self.cancel.cancelled
            if not keep:
                stderr = self._end(kill=self.cancel.cancelled or digests is None)
        self.cancel.check()
        if error:
            raise UserError(error)
        if digests is None:
            last = (stderr or "").strip().splitlines()
            raise RuntimeError("the determinism check's second run (a fresh process) failed: "
                               + (last[-1] if last else f"exit code {self.proc.returncode}"))
        return digests


def load_reference(spec: str) -> "UnfusedReference":
    """The reference named by its `spec` ("module:attribute", a module of this
    tool), made again in this process: the parent passes the one it holds."""
    import importlib

    module, _, attr = spec.partition(":")
    if not module.startswith("bisect_tui.") or not attr.isidentifier():
        raise UserError(f"the second run was handed {spec!r}, not a reference of this tool")
    return getattr(importlib.import_module(module), attr)()


class HashSink:
    """SHA-256 of each tensor over all samples, the digest the manifest records.

    `keep`: the floating-point arrays are also kept, for the float64 truth's check
    (the same FP32 baseline, bit for bit when it is deterministic; the second run
    starts early only when the activations are a small share of the memory budget)."""

    def __init__(self, keep: bool = False):
        self.hashes: dict[str, "hashlib._Hash"] = {}
        self.digests: dict[str, str] = {}
        self.kept: Optional[dict[tuple[str, int], np.ndarray]] = {} if keep else None

    def write(self, tensor: str, sample: int, array: np.ndarray) -> None:
        import numpy as np

        self.hashes.setdefault(tensor, hashlib.sha256()).update(
            np.ascontiguousarray(array).tobytes()
        )
        if self.kept is not None and array.dtype.kind == "f":
            self.kept[(tensor, sample)] = array

    def value(self, tensor: str, sample: int) -> Optional[np.ndarray]:
        return None if self.kept is None else self.kept.get((tensor, sample))

    def end(self, tensor: str) -> None:
        self.digests[tensor] = self.hashes.pop(tensor).hexdigest()


# How much lower the second run's process runs than this one. It works beside the
# engine under test's build, which the check waits on first, and its digests are read
# only after the fused engine is judged: at its own priority it shared the cores with
# that build (21,000 nodes: the engine was built 1.2-4.6 s later, docs/benchmarks.md
# section 4, eleventh pass). Lowered, it still gets what the build leaves, and all of an
# idle machine.
NICE = 5


def main(argv: list[str]) -> int:
    import numpy as np

    from bisect_tui.core import startup_gc
    from bisect_tui.core.groups import run_groups
    from bisect_tui.core.inputs import InputSet
    from bisect_tui.core.session import Session

    if argv[:1] == ["--stdin"]:
        if argv[1:]:  # the reference's library imported while waiting, not after
            load_reference(argv[1]).warm_up()
        line = sys.stdin.readline()
        if not line.strip():
            return 0  # not needed after all
        argv = json.loads(line)
    reference = load_reference(argv[2])
    startup_gc.imports_done()
    session = Session(Path(argv[0]))
    with open(argv[1], encoding="utf-8") as fh:
        plan = json.load(fh)
    model = _load_prepared(session.model_path)
    with np.load(session.inputs_path, allow_pickle=False) as z:
        inputs = InputSet({k: z[k] for k in z.files}, {})
    truth = plan.get("truth")
    sink = HashSink(keep=bool(truth))

    def progress(p) -> None:
        print(json.dumps({"progress": p.message, "done": p.done, "total": p.total}), flush=True)

    parts = None
    if plan.get("cuts"):
        from bisect_tui.core.parted_run import run_in_parts

        try:
            parts = run_in_parts(reference, model, plan["cuts"], [t for g in plan["groups"] for t in g], inputs,
                                 sink, progress)
        except Exception:  # noqa: BLE001 - a part the reference will not take alone: one session then
            parts = None
        if parts is None:
            sink = HashSink(keep=bool(truth))
    if parts is None:
        # marked untyped (types=None): the session types each output from its node,
        # so this process needs no shape inference of its own
        run_groups(reference, model, plan["groups"], inputs, sink, None, None, progress, "determinism")
    print(json.dumps({"digests": sink.digests, **({"parts": parts} if parts else {})}), flush=True)
    if truth:
        _float64_truth(model, inputs, truth["outputs"], truth["file"], reference, sink.value)
    return 0


def _load_prepared(path: Path):
    """The session's prepared model, which the parent checked and wrote: read,
    not checked and indexed again (the checker, the index and the shape
    inference were a quarter of this process's work on a 5,000-node model).
    The reference still validates it when the session is made."""
    from bisect_tui.core.external_data import load

    try:
        return load(path)  # external data: the weights stay in their files, their folder known
    except Exception as exc:  # noqa: BLE001 - protobuf's errors: one line for the parent
        text = (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]
        raise UserError(f"the second run could not read the session's model: {text}") from None


def _float64_truth(model, inputs, outputs: list[str], dest: str, reference: "UnfusedReference",
                   fp32=None) -> None:
    """The arbiter's float64 run of the whole model (it needs no engine), while
    the parent judges the engine; the arrays go to `dest` (in the session's tmp/),
    one line says what computed them, how the truth compared with `fp32` (this
    process's own FP32 run, tensor by tensor) and numpy's warnings, which the
    parent writes to the session's log."""
    import os

    import numpy as np

    from bisect_tui.core.reference import float64_outputs

    try:
        got = float64_outputs(model, inputs, outputs, reference, fp32)
        arrays, ran_with, fallback_reason = got
    except UserError as exc:
        print(json.dumps({"truth_error": str(exc)}), flush=True)
        return
    part = dest + ".part"
    with open(part, "wb") as fh:
        np.savez(fh, **{f"o{i}": arrays[n] for i, n in enumerate(outputs)})
    os.replace(part, dest)
    print(json.dumps({"truth": {"ran_with": ran_with, "fallback_reason": fallback_reason,
                                "reference_check": got.reference_check, "warnings": list(got.warnings)}},
                     default=float), flush=True)


def _exit_now(code: int) -> None:
    """Everything this process owes is on stdout (flushed): exit without tearing
    down the reference's library and the model, 40 ms the parent would otherwise wait for."""
    import os

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(code)


if __name__ == "__main__":
    from bisect_tui.core import background, startup_gc

    background.lower_priority(NICE)  # before the imports: they run beside the engine's build too

    startup_gc.pause()  # for the imports: main() freezes what they made and turns it back on
    try:
        code = main(sys.argv[1:])
    except UserError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        _exit_now(2)
    _exit_now(code)
