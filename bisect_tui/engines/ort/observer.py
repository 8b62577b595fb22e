"""The fused program's own tensors, read from ORT's saved optimized graph.

Reloaded at ORT_DISABLE_ALL that graph reproduces the fused session, and its
tensors can be marked without undoing a fusion (they are already fused). At
ORT_DISABLE_ALL each node is its own kernel on its own inputs, so the graph may
also be run in parts cut at separators (core/bisect/parts.py), each part marking
its own tensors: at 21,000 nodes one session marking the probe's 7,000 tensors
took 0.89 CPU-s to load, make and run, 19 parts 0.50 with their plan, with the same bits. That is an
instrument of its own, so the probe checks it on a control before its verdict
counts: the graph outputs it reads must be the engine's own outputs, bit for bit
(core/bisect/probe.py), and `whole()` takes it back to one session where they
are not, or where the probe has none to check against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from bisect_tui.core.external_data import has_external_data
from bisect_tui.core.graph import GraphIndex, mark_outputs
from bisect_tui.api import UserError
from bisect_tui.engines.ort.loading import load_runnable as _load_runnable


class OrtObserver:
    """One session per tensor group (or one per part of the graph), reused for every sample."""

    def __init__(self, optimized_path: Path, in_parts: bool = False):
        self.model = _load_runnable(optimized_path)
        self._group: Optional[tuple[str, ...]] = None
        self._session = None
        self._parts: Optional[list] = None  # per part: [session or None, inputs, outputs, cut, nodes]
        self._plan = self._cut_plan() if in_parts else None

    @property
    def in_parts(self) -> bool:
        """Whether `observe` runs the graph in parts (False after `whole()`)."""
        return self._plan is not None

    @property
    def part_count(self) -> int:
        return len(self._plan[2]) if self._plan is not None else 1

    def whole(self) -> None:
        """One session of the whole graph from now on (the probe's control differed)."""
        self._plan = None
        self.close()

    def _cut_plan(self) -> Optional[tuple]:
        from bisect_tui.core.bisect.parts import initializer_positions, plan_cuts, split_nodes

        g = self.model.graph
        names = [n.name for n in g.node]
        if not all(names) or len(set(names)) != len(names) or has_external_data(self.model):
            return None  # the index keys nodes by name; a part's weights must be in its proto
        index = GraphIndex.build(self.model)
        cuts = plan_cuts(index)
        if not cuts:
            return None
        return index, cuts, split_nodes(index, cuts), initializer_positions(self.model)

    @property
    def tensors(self) -> list[str]:
        """Every tensor the fused program computes, in its node order (read once: the
        probe asks for them and for `baseline_names`, each a walk of the whole graph)."""
        got = self.__dict__.get("_tensors")
        if got is None:
            got = self.__dict__["_tensors"] = tuple(dict.fromkeys(
                o for n in self.model.graph.node for o in n.output if o))
        return list(got)

    @property
    def baseline_names(self) -> dict[str, str]:
        """FP16 on the CPU provider computes most tensors as FP32 copies under a
        prefixed name (`InsertedPrecisionFreeCast_X` holds X): the probe compares those with X."""
        from bisect_tui.engines.ort.fusedmap import _ALIAS_PREFIXES

        return {t: t[len(p):] for t in self.tensors for p in _ALIAS_PREFIXES[:2] if t.startswith(p)}

    def observe(self, feeds: dict[str, np.ndarray], tensors) -> dict[str, np.ndarray]:
        from bisect_tui.core.legacy_models import drop_unfed_inputs
        from bisect_tui.engines.ort.unfused import make_session

        group = tuple(tensors)
        if group != self._group:
            self.close()
            drop_unfed_inputs(self.model, feeds)  # an IR-3 graph's folded initializers (core/legacy_models.py)
            if self._plan is None:
                # untyped marks: ORT types them from their nodes (no shape inference of the fused graph)
                self._session = make_session(mark_outputs(self.model, list(group), types={}, keep_original=False))
            else:
                self._parts = self._part_list(group)
            self._group = group
        if self._parts is not None:
            try:
                return self._run_parts(feeds, group)
            except Exception:  # noqa: BLE001 - a part ORT will not take alone: the whole graph then
                self.whole()
                return self.observe(feeds, tensors)
        try:
            names = [o.name for o in self._session.get_outputs()]
            values = self._session.run(names, feeds)
        except UserError:
            raise
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"ONNX Runtime failed to run the model: {msg[:300]}") from None
        return {n: v for n, v in zip(names, values) if isinstance(v, np.ndarray)}

    def _part_list(self, group: tuple[str, ...]) -> list:
        """Each part that a tensor of `group` needs, with what it reads and gives;
        sessions are made on the first sample (a cut's type is its array's)."""
        index, cuts, parts, _ = self._plan
        wanted = set(group)
        graph_inputs = set(index.graph_inputs)
        last = max((k for k, nodes in enumerate(parts) if any(o in wanted for n in nodes for o in n.output)),
                   default=-1)
        out = []
        for k, nodes in enumerate(parts[:last + 1]):
            reads = dict.fromkeys(t for n in nodes for t in index.inputs.get(n.name, ()) if t in graph_inputs)
            ins = ([cuts[k - 1]] if k else []) + list(reads)
            gives = [o for n in nodes for o in n.output if o in wanted]
            cut = cuts[k] if k < last else None
            out.append([None, ins, gives + ([cut] if cut and cut not in wanted else []), cut, nodes])
        return out

    def _run_parts(self, feeds: dict[str, np.ndarray], group: tuple[str, ...]) -> dict[str, np.ndarray]:
        from bisect_tui.core.bisect.parts import part_model, typed_input
        from bisect_tui.engines.ort.unfused import make_session

        index, cuts, _, inits_at = self._plan
        graph_inputs = {i.name: i for i in self.model.graph.input}
        carried = dict(feeds)
        got: dict[str, np.ndarray] = {}
        for entry in self._parts:
            session, ins, gives, cut, nodes = entry
            if session is None:
                vis = [typed_input(t, carried[t], shaped=False) if t not in graph_inputs else graph_inputs[t]
                       for t in ins]
                entry[0] = session = make_session(part_model(self.model, nodes, vis, gives, index, inits_at))
            values = session.run(gives, {t: carried[t] for t in ins})
            got.update(zip(gives, values))
            if cut is not None:
                carried[cut] = got[cut]
        return {t: got[t] for t in group if isinstance(got.get(t), np.ndarray)}

    def close(self) -> None:
        self._session = None
        self._parts = None
        self._group = None
