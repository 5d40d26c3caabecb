"""The dependency graph of named tensors, found by walking the autograd graph.

From each tensor registered in an iteration, the walk follows ``grad_fn``
backwards and stops at the nearest registered tensors and tracked parameters;
everything in between is left out. Manual connections
(``add_tensor_connection``) are extra edges that the walk follows like
autograd's own. The walk is iterative (deep recurrent graphs exceed Python's
recursion limit) and memoised, so each autograd node is visited once.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from comgra.capture.registry import Registration


@dataclass
class Connections:
    """Where the walk stops (registered tensors) and which extra edges it follows."""

    by_grad_fn: dict[Any, Hashable] = field(default_factory=dict)  # grad_fn -> registration key
    by_leaf: dict[int, Hashable] = field(default_factory=dict)  # id(leaf tensor) -> registration key
    extra_by_grad_fn: dict[Any, list[Any]] = field(default_factory=dict)  # grad_fn -> sources
    extra_by_leaf: dict[int, list[Any]] = field(default_factory=dict)  # id(leaf) -> sources
    # grad_fn -> what the walk follows in place of its next_functions: a reentrant checkpoint's node leads to the
    # recomputed outputs of its function (capture/checkpointing.py), as the uncheckpointed graph would
    instead_of: dict[Any, list[Any]] = field(default_factory=dict)

    def add_manual(self, source: Any, sink: torch.Tensor, grad_fn: Any = None) -> None:
        """``source`` (a registration key or a tensor) feeds ``sink``, whose autograd node is ``grad_fn``
        (for a registered sink: the node it had when it was registered), else its current one."""
        grad_fn = grad_fn if grad_fn is not None else sink.grad_fn
        if grad_fn is not None:
            self.extra_by_grad_fn.setdefault(grad_fn, []).append(source)
        else:
            self.extra_by_leaf.setdefault(id(sink), []).append(source)


def dependencies(tensor: torch.Tensor, grad_fn: Any, connections: Connections,
                 memo: dict[Any, frozenset]) -> frozenset:
    """The registration keys that ``tensor`` depends on directly (through unregistered ops only).

    ``grad_fn`` is the autograd node the tensor had when it was registered: an in-place op
    afterwards (``ReLU(inplace=True)``, ``out += identity``) gives the tensor a new ``grad_fn``
    whose inputs include the registered tensor itself.
    """
    found: set = set()
    for child in _children_of_tensor(tensor, grad_fn, connections):
        found |= _resolve(child, connections, memo)
    return frozenset(found)


def _children_of_tensor(tensor: torch.Tensor, grad_fn: Any, connections: Connections) -> list[Any]:
    if grad_fn is None:
        return list(connections.extra_by_leaf.get(id(tensor), ()))
    return _children(grad_fn, connections)


def _children(fn: Any, connections: Connections) -> list[Any]:
    replaced = connections.instead_of.get(fn) if connections.instead_of else None
    children: list[Any] = list(replaced) if replaced is not None else [nf for nf, _ in fn.next_functions if nf is not None]
    children.extend(connections.extra_by_grad_fn.get(fn, ()))
    variable = getattr(fn, "variable", None)  # AccumulateGrad of an unregistered leaf
    if variable is not None:
        children.extend(connections.extra_by_leaf.get(id(variable), ()))
    return children


def _resolve(start: Any, connections: Connections, memo: dict[Any, frozenset]) -> frozenset:
    """Iterative post-order walk from ``start``; memo maps autograd nodes to their nearest keys.

    The common item, an autograd node, is handled inline and its children are listed once (reading
    ``next_functions`` builds a new tuple each time): the walk visits a few hundred nodes per iteration
    of a ResNet-18, and function calls per node were most of its time."""
    stack = [start]
    children_of: dict[Any, list[Any]] = {}
    by_grad_fn, by_leaf, extra_by_grad_fn = connections.by_grad_fn, connections.by_leaf, connections.extra_by_grad_fn
    instead_of = connections.instead_of or None
    while stack:
        item = stack[-1]
        node = _as_node(item)
        if node in memo:
            stack.pop()
            continue
        children = children_of.get(node)
        if children is None:
            if isinstance(item, torch.Tensor):
                children = _children_of_item(item, connections)
            else:
                next_functions = getattr(item, "next_functions", None)
                if next_functions is None:  # a registration key from a manual connection
                    memo[node] = frozenset([item])
                    stack.pop()
                    continue
                key = by_grad_fn.get(item)
                variable = getattr(item, "variable", None)  # AccumulateGrad of a leaf
                if key is None and variable is not None:
                    key = by_leaf.get(id(variable))
                if key is not None:
                    memo[node] = frozenset([key])
                    stack.pop()
                    continue
                replaced = instead_of.get(item) if instead_of is not None else None
                children = list(replaced) if replaced is not None else [nf for nf, _ in next_functions if nf is not None]
                children.extend(extra_by_grad_fn.get(item, ()))
                if variable is not None:
                    children.extend(connections.extra_by_leaf.get(id(variable), ()))
            children_of[node] = children
        pending = [c for c in children if _as_node(c) not in memo]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        memo[node] = frozenset().union(*(memo[_as_node(c)] for c in children))
    return memo[_as_node(start)]


def _as_node(item: Any) -> Any:
    return ("tensor", id(item)) if isinstance(item, torch.Tensor) else item


def _children_of_item(item: Any, connections: Connections) -> list[Any]:
    if isinstance(item, torch.Tensor):  # an unregistered source tensor of a manual connection
        key = connections.by_leaf.get(id(item)) if item.grad_fn is None else connections.by_grad_fn.get(item.grad_fn)
        if key is not None:
            return [key]
        return _children_of_tensor(item, item.grad_fn, connections)
    return _children(item, connections)


# -- graph documents ----------------------------------------------------------------------------

def layout(nodes: list[dict[str, Any]], edges: Iterable[tuple[str, str]]) -> None:
    """Set ``column`` and ``row`` on each node: columns left to right by dependency.

    A node's column is the length of the longest path reaching it. Parameters
    move right, to just before their first consumer, and all parameters of one
    visual group share a column.
    """
    incoming: dict[str, set[str]] = {n["id"]: set() for n in nodes}
    outgoing: dict[str, set[str]] = {n["id"]: set() for n in nodes}
    for source, target in edges:
        if source != target:
            incoming[target].add(source)
            outgoing[source].add(target)
    column = _longest_path_layers(incoming)
    groups: dict[str, list[dict[str, Any]]] = {}
    for node in nodes:
        if node["role"] == "parameter":
            groups.setdefault(node.get("group", ""), []).append(node)
    for members in groups.values():
        consumers = [column[t] for m in members for t in outgoing[m["id"]]]
        target_column = max(0, min(consumers) - 1) if consumers else 0
        for m in members:
            column[m["id"]] = target_column
    rows: dict[int, int] = {}
    order = {"parameter": 1}
    for node in sorted(nodes, key=lambda n: (column[n["id"]], order.get(n["role"], 0), n.get("group", ""), n["id"])):
        node["column"] = column[node["id"]]
        node["row"] = rows.get(node["column"], 0)
        rows[node["column"]] = node["row"] + 1


def _longest_path_layers(incoming: dict[str, set[str]]) -> dict[str, int]:
    layer: dict[str, int] = {}
    remaining = dict(incoming)
    while remaining:
        ready = [n for n, deps in remaining.items() if all(d in layer for d in deps)]
        if not ready:  # a cycle from manual connections: place the rest after what is known
            ready = sorted(remaining)[:1]
        for n in ready:
            layer[n] = 1 + max((layer[d] for d in remaining[n] if d in layer), default=-1)
            del remaining[n]
    return layer


def graph_hash(document: dict[str, Any]) -> str:
    canonical = json.dumps({"nodes": document["nodes"], "edges": document["edges"]}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


_ROLE_OF_TYPE = {"calculated": "intermediate"}


def outputs(nodes: dict[str, dict[str, Any]], edges: list[tuple[str, str]]) -> set[str]:
    """The network's outputs: what is compared with a target (it shares a consumer with one);
    without a registered target, what feeds a loss directly."""
    def feeding(consumers: set[str]) -> set[str]:
        return {s for s, t in edges if t in consumers and nodes[s]["role"] == "intermediate"}

    targets = {n for n, node in nodes.items() if node["role"] == "target"}
    compared = feeding({t for s, t in edges if s in targets})
    return compared or feeding({n for n, node in nodes.items() if node["role"] == "loss"})


def node_entry(node_id: str, registration: Registration, iteration: int,
               groups_of_parameters: dict[str, str]) -> dict[str, Any]:
    absolute = registration.iteration < 0
    entry = {
        "id": node_id,
        "node": registration.node,
        "role": _ROLE_OF_TYPE.get(registration.tensor_type, registration.tensor_type),
        "tensor_type": registration.tensor_type,
        "roles": [],
        "has_batch": registration.batch_dim is not None,
        "iteration_offset": 0 if absolute else registration.iteration - iteration,
        "absolute_iteration": -1 if absolute else None,
        "group": groups_of_parameters.get(registration.tensor_name, ""),
    }
    if registration.module_type:  # comgra.watch's module outputs: "model.1" is a ReLU (the id stays "model.1")
        entry["module_type"] = registration.module_type
    return entry
