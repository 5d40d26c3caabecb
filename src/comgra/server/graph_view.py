"""The dependency graph as the browser draws it: a pure function of the stored graph document.

The server sends a graph once per structure (its hash); the page keeps it and
draws it with ``assets/comgra_graph.js``, which also selects, highlights and
moves along the graph without asking the server. This module decides what the
drawing means, so that it can be tested without a browser:

* parameters sit in boxes, one per module, next to the node that consumes
  them: the recorder's visual ``group`` where the user gave prefixes, else the
  module part of the parameter's name (``model.blocks.0.attn.q_proj.weight``
  -> box ``model.blocks.0.attn.q_proj``, label ``weight``);
* every node carries its full name (search, hover card, ``aria-label``) and a
  short label without its box's prefix;
* ``badges`` (node id -> short text, e.g. from findings) are shown on nodes.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dash import html

from comgra.server.dom import attributes

ROLE_NAMES = {
    "input": "input", "target": "target", "loss": "loss", "output": "output", "parameter": "parameter",
    "intermediate": "intermediate", "initial_value": "initial value",
}
LABEL_LIMIT = 44  # characters; longer labels keep their start and end around a middle ellipsis


def legend() -> html.Div:
    items = [html.Span(label, className=f"legend-item role-{role}") for role, label in ROLE_NAMES.items()]
    return html.Div(items, className="graph-legend", **attributes({"aria-label": "Colours of the node roles"}))


def client_graph(graph: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The graph document the page keeps and draws: nodes with labels and boxes, edges, parameter boxes."""
    if not graph or not graph.get("nodes"):
        return None
    nodes = list(graph["nodes"])
    edges = [{"source": e["source"], "target": e["target"], "source_role": e.get("source_role"),
              "target_role": e.get("target_role")} for e in graph.get("edges") or []]
    box_of = {n["id"]: box for n in nodes if (box := parameter_box(n)) is not None}
    boxes = _boxes(nodes, edges, box_of)
    has_dependencies = {e["target"] for e in edges if e["source"] != e["target"]}
    has_dependents = {e["source"] for e in edges if e["source"] != e["target"]}
    return {
        "hash": graph.get("hash", ""),
        "nodes": [_client_node(n, box_of.get(n["id"]), n["id"] in has_dependencies, n["id"] in has_dependents)
                  for n in nodes],
        "edges": edges,
        "boxes": boxes,
    }


def parameter_box(node: Mapping[str, Any]) -> str | None:
    """The box of a parameter node: the user's visual group, else its module; None for other nodes."""
    if node.get("role") != "parameter":
        return None
    group = node.get("group")
    if isinstance(group, str) and group:
        return group
    name = str(node.get("node", ""))
    return name.rsplit(".", 1)[0] if "." in name else None


def short_label(name: str, box: str | None) -> str:
    """The name shown on a node: without its box's prefix, and with a middle ellipsis when still too long."""
    if box and name.startswith(box + ".") and len(name) > len(box) + 1:
        name = name[len(box) + 1:]
    if len(name) <= LABEL_LIMIT:
        return name
    head = (LABEL_LIMIT - 1) * 2 // 5
    return f"{name[:head]}…{name[-(LABEL_LIMIT - 1 - head):]}"


def box_label(box: str) -> str:
    """The end of a module's name that tells boxes apart: ``attn.q_proj``, ``blocks.0.ln1``."""
    parts = box.split(".")
    count = 3 if len(parts) >= 3 and parts[-2].isdigit() else 2
    return ".".join(parts[-count:]) if len(parts) > count else box


def _client_node(node: Mapping[str, Any], box: str | None, has_dependencies: bool,
                 has_dependents: bool) -> dict[str, Any]:
    role = str(node.get("role", "intermediate"))
    old = int(node.get("iteration_offset") or 0) < 0
    roles = [r for r in node.get("roles") or [] if isinstance(r, str)]
    aliases = [a for a in node.get("aliases") or [] if isinstance(a, str)]  # tied weights: the other names
    module_type = node.get("module_type") if isinstance(node.get("module_type"), str) else ""
    detail = " · ".join([ROLE_NAMES.get(role, role), *(["previous iteration"] if old else []),
                         *([f"{len(roles)} roles"] if len(roles) > 1 else []), *(["tied"] if aliases else [])])
    label = short_label(str(node["node"]), box)
    return {
        "id": node["id"], "name": node["node"], "label": f"{label} ({module_type})" if module_type else label,
        "module_type": module_type, "role": role,
        "roles": roles, "detail": detail, "old": old, "aliases": aliases, "box": box,
        "column": int(node.get("column") or 0), "row": int(node.get("row") or 0),
        "has_dependencies": has_dependencies, "has_dependents": has_dependents,
    }


def _boxes(nodes: list[Mapping[str, Any]], edges: list[dict[str, Any]], box_of: dict[str, str]) -> list[dict[str, Any]]:
    """One box per module, attached to the first node (leftmost, then topmost) that consumes its parameters."""
    position = {n["id"]: (int(n.get("column") or 0), int(n.get("row") or 0)) for n in nodes}
    members: dict[str, list[str]] = {}
    for node in nodes:
        if node["id"] in box_of:
            members.setdefault(box_of[node["id"]], []).append(node["id"])
    consumers: dict[str, set[str]] = {}
    for edge in edges:
        box = box_of.get(edge["source"])
        if box is not None and edge["target"] not in box_of and edge["target"] in position:
            consumers.setdefault(box, set()).add(edge["target"])
    boxes = []
    for box, ids in sorted(members.items()):
        consumer = min(consumers.get(box, ()), key=lambda n: (position[n], n), default=None)
        boxes.append({"id": box, "label": box_label(box),
                      "members": sorted(ids, key=lambda n: (position[n][1], n)), "consumer": consumer,
                      "column": min(position[n][0] for n in ids)})
    return boxes
