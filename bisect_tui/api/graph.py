"""Records of an engine's optimized program, in the original graph's words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class FusedNode:
    """One node of the engine's optimized program, mapped back to the original graph."""

    name: str
    op_type: str
    domain: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    # names of the prepared model's nodes this node replaced, topological order
    original_nodes: list[str] = field(default_factory=list)
    # names of the engine's passes that made this node, as far as the engine can tell
    passes: list[str] = field(default_factory=list)

    @property
    def is_fused(self) -> bool:
        """True when this node is not simply one original node left as it was."""
        if len(self.original_nodes) > 1:
            return True
        return bool(self.passes)

    def to_dict(self) -> dict:
        # by hand, not dataclasses.asdict: maps of thousands of nodes are written per build;
        # the key stays "optimizers" (report.json and the maps cached in sessions)
        return {"name": self.name, "op_type": self.op_type, "domain": self.domain,
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "original_nodes": list(self.original_nodes), "optimizers": list(self.passes),
                "is_fused": self.is_fused}

    @classmethod
    def from_dict(cls, d: dict) -> "FusedNode":
        return cls(
            name=d["name"],
            op_type=d["op_type"],
            domain=d.get("domain", ""),
            inputs=list(d.get("inputs", [])),
            outputs=list(d.get("outputs", [])),
            original_nodes=list(d.get("original_nodes", [])),
            passes=list(d.get("optimizers", [])),
        )

