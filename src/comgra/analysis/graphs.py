"""The dependency graphs of a trial, asked the questions the detectors have.

A graph document describes one iteration; a node id ending in ``*old`` is the same tensor in the
previous iteration, and parameters and initial values have no iteration (-1).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

OLD = "*old"
LOSS_WORDS = ("loss",)


@dataclass
class GraphFacts:
    """What every graph of a trial says about its nodes, merged."""

    column: dict[str, int] = field(default_factory=dict)  # node name -> the earliest column it has
    role: dict[str, str] = field(default_factory=dict)  # node name -> graph role (input, output, loss, ...)
    feeds: dict[str, set[str]] = field(default_factory=dict)  # node name -> names of its direct dependents
    learned: set[str] = field(default_factory=set)  # nodes computed directly from a parameter

    def is_loss_like(self, node: str, tensor_type: str | None = None) -> bool:
        """A loss: registered as one, or named so (``loss_per_sample``)."""
        return (self.role.get(node) == "loss" or tensor_type == "loss"
                or any(word in node.lower() for word in LOSS_WORDS))

    def feeds_output(self, node: str) -> bool:
        """Whether the node goes into the network's output or loss through a fixed function only (no
        parameter in between, as ``sigmoid(logits)``): its range is then the output's range."""
        return any((self.role.get(d) == "output" or self.is_loss_like(d)) and d not in self.learned
                   for d in self.feeds.get(node, ()))


def facts(graphs: Iterable[dict[str, Any]]) -> GraphFacts:
    result = GraphFacts()
    for graph in graphs:
        for node in graph.get("nodes", []):
            name = node["node"]
            result.column[name] = min(result.column.get(name, 1 << 30), int(node.get("column") or 0))
            result.role.setdefault(name, node.get("role", ""))
        roles = {n["id"]: n.get("role") for n in graph.get("nodes", [])}
        for edge in graph.get("edges", []):
            result.feeds.setdefault(_name(edge["source"]), set()).add(_name(edge["target"]))
            if roles.get(edge["source"]) == "parameter":
                result.learned.add(_name(edge["target"]))
    return result


def dependencies(graph: dict[str, Any], iteration: int) -> dict[tuple[str, int], set[tuple[str, int]]]:
    """(node, data iteration) -> the (node, data iteration) it reads, within one iteration's graph."""
    nodes = {n["id"]: n for n in graph.get("nodes", [])}
    result: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for node in nodes.values():
        result.setdefault(_located(node, iteration), set())
    for edge in graph.get("edges", []):
        source, target = nodes.get(edge["source"]), nodes.get(edge["target"])
        if source is None or target is None:
            continue
        result.setdefault(_located(target, iteration), set()).add(_located(source, iteration))
    return result


def order_key(node: dict[str, Any] | None, iteration: int) -> tuple[int, int, int]:
    """Earlier in the forward pass sorts first: iteration, then column, then row."""
    if node is None:
        return (iteration, 1 << 30, 0)
    return (iteration, int(node.get("column") or 0), int(node.get("row") or 0))


def _located(node: dict[str, Any], iteration: int) -> tuple[str, int]:
    absolute = node.get("absolute_iteration")
    if absolute is not None:
        return node["node"], int(absolute)
    return node["node"], iteration + int(node.get("iteration_offset") or 0)


def _name(node_id: str) -> str:
    return node_id.removesuffix(OLD)
