"""An unfused reference's run of every tensor, made as the graph's parts.

Why: a reference session that marks every tensor of a 21,000-node graph took
1.03 CPU-s to make and 0.12 to run; the same run in 33 parts cut at separators
(core/bisect/parts.py: one tensor carries all that the nodes below read from
above) took 0.66, bit for bit, because an unfused reference runs each node as its
own kernel on its own inputs (`UnfusedReference.runs_in_parts` says so). The
determinism check's second run is made this way; the baseline dump stays one
session, so the two runs prove each other: the digests match only if the parts
gave the one session's bits and the runs are deterministic, and a mismatch is
settled by a second run in one session (core/checks.py).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import onnx

from bisect_tui.core.cancel import Progress, ProgressFn, no_progress

_SUBGRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def plan_cuts_for(triage) -> tuple[str, ...]:
    """Where the second run may cut the prepared model (() for one session): only on a
    reference that runs parts as the whole, a model with its weights inside and enough
    nodes to gain (a model with subgraphs, which read tensors from outside themselves,
    is run in one session by the child: _split). The separators are the search's
    (parts.cuts_for keeps them on the triage)."""
    from bisect_tui.core.bisect.parts import PART_NODES, plan_cuts, triage_separators

    info = triage.info
    if not getattr(triage.reference, "runs_in_parts", False) or info.external:
        return ()
    if len(info.index.nodes) < 2 * PART_NODES:
        return ()
    return plan_cuts(info.index, seps=triage_separators(triage))


def _split(model: onnx.ModelProto, cuts: Sequence[str]) -> Optional[list[tuple[list, list[str]]]]:
    """(nodes, graph inputs read) per part, in the file's node order, part k ending with
    the node that makes cuts[k]; None unless every node reads only its own part's
    tensors, the graph's inputs and weights and the cut coming in (then one session)."""
    g = model.graph
    graph_inputs = {i.name for i in g.input}
    weights = {t.name for t in g.initializer}
    ends = {c: k for k, c in enumerate(cuts)}
    parts: list[tuple[list, list[str]]] = []
    nodes: list = []
    reads: dict[str, None] = {}
    made: set[str] = set()
    incoming: Optional[str] = None
    for n in g.node:
        if any(a.type in _SUBGRAPH_ATTRS for a in n.attribute):
            return None
        for t in n.input:
            if not t or t in made or t in weights or t == incoming:
                continue
            if t not in graph_inputs:
                return None
            reads[t] = None
        nodes.append(n)
        made.update(o for o in n.output if o)
        cut = next((o for o in n.output if o in ends), None)
        if cut is not None:
            if ends[cut] != len(parts):
                return None  # the cuts out of the file's order
            parts.append((nodes, list(reads)))
            nodes, reads, made, incoming = [], {}, set(), cut
    if len(parts) != len(cuts) or not nodes:
        return None
    parts.append((nodes, list(reads)))
    return parts


def run_in_parts(reference, model: onnx.ModelProto, cuts: Sequence[str], tensors: Sequence[str], inputs,
                 sink, progress: ProgressFn = no_progress, stage: str = "determinism") -> Optional[int]:
    """Every tensor of `tensors` for every sample into `sink` (write, end), as run_groups
    writes them; the number of parts, or None when the model cannot be cut there
    (nothing was written: the caller runs one session)."""
    from bisect_tui.core.bisect.parts import assemble_part, typed_input
    from bisect_tui.core.groups import open_session

    plan = _split(model, cuts)
    if plan is None:
        return None
    wanted = set(tensors)
    declared = {i.name: i for i in model.graph.input}
    weights = {t.name: t for t in model.graph.initializer}
    samples = max(inputs.samples, 1)
    carried = [dict(inputs.feeds(k)) for k in range(samples)]
    total = len(wanted)
    done = 0
    for k, (nodes, reads) in enumerate(plan):
        cut_in = cuts[k - 1] if k else None
        cut_out = cuts[k] if k < len(cuts) else None
        outs = [o for n in nodes for o in n.output if o and (o in wanted or o == cut_out)]
        ins = ([typed_input(cut_in, carried[0][cut_in], shaped=False)] if cut_in else []) + [declared[t] for t in reads]
        names_in = [i.name for i in ins]
        used = dict.fromkeys(t for n in nodes for t in n.input if t in weights)
        sess = open_session(reference, assemble_part(model, nodes, ins, outs, [weights[t] for t in used]))
        names = sess.output_names()
        written = []
        for s in range(samples):
            values = sess.run(names, {t: carried[s][t] for t in names_in})
            for name, value in zip(names, values):
                if name in wanted and isinstance(value, np.ndarray):
                    sink.write(name, s, value)
                    if s == 0:
                        written.append(name)
                if name == cut_out:
                    carried[s] = {t: carried[s][t] for t in declared if t in carried[s]}
                    carried[s][cut_out] = value
            del values
        for name in written:
            sink.end(name)
        del sess
        done += len(written)
        progress(Progress(stage, f"part {k + 1}/{len(plan)}", done, total, {"part": k + 1, "parts": len(plan)}))
    return len(plan)
