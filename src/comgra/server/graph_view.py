"""The dependency graph of one iteration as HTML: a pure function of graph JSON and selection.

Every node is an element a test or a screen reader can find by name
(``data-node`` holds the graph id, ``aria-label`` a sentence). Only the
selected node's links are drawn, as rotated ``div`` lines: thick where the
selected role has the link, thin where only other roles of the node have it.
A dotted left (right) border marks a node without dependencies (dependents)
in this iteration. Parameters of one module (the recorder's visual ``group``)
share a frame.
"""
from __future__ import annotations

import math
from typing import Any

from dash import html

from comgra.server.dom import attributes

NODE_WIDTH = 150
NODE_HEIGHT = 44
COLUMN_GAP = 46
ROW_GAP = 14
PADDING = 12
ROLE_NAMES = {
    "input": "input", "target": "target", "loss": "loss", "output": "output", "parameter": "parameter",
    "intermediate": "intermediate", "initial_value": "initial value",
}


def legend() -> html.Div:
    items = [html.Span(label, className=f"legend-item role-{role}") for role, label in ROLE_NAMES.items()]
    return html.Div(items, className="graph-legend", **attributes({"aria-label": "Colours of the node roles"}))


def render_graph(graph: dict[str, Any] | None, selected_id: str | None, selected_role: str | None) -> html.Div:
    """The graph of the current iteration, with the selected node and its links highlighted."""
    if not graph or not graph.get("nodes"):
        return html.Div("No graph to show.", className="graph-empty")
    edges = graph.get("edges") or []
    sources = {e["target"] for e in edges}
    targets = {e["source"] for e in edges}
    links = _links(edges, selected_id, selected_role)
    dependencies = {other for (other, side), _ in links.items() if side == "dependency"}
    dependents = {other for (other, side), _ in links.items() if side == "dependent"}
    nodes = [_node(n, selected_id, dependencies, dependents, has_deps=n["id"] in sources,
                   has_dependents=n["id"] in targets) for n in graph["nodes"]]
    positions = {n["id"]: _position(n) for n in graph["nodes"]}
    lines = [_line(positions, other, selected_id, side, full) for (other, side), full in links.items()
             if other in positions and selected_id is not None and selected_id in positions]
    width = max(p[0] for p in positions.values()) + NODE_WIDTH + PADDING
    height = max(p[1] for p in positions.values()) + NODE_HEIGHT + PADDING
    groups = _parameter_groups(graph["nodes"], positions)
    return html.Div([*groups, *lines, *nodes], className="graph-canvas",
                    style={"width": f"{width}px", "height": f"{height}px"}, **attributes({"data-graph": graph.get("hash", "")}))


def _parameter_groups(nodes: list[dict[str, Any]], positions: dict[str, tuple[int, int]]) -> list[html.Div]:
    """A frame around the parameters of one module (the recorder's visual grouping)."""
    members: dict[str, list[tuple[int, int]]] = {}
    for node in nodes:
        if node.get("role") == "parameter" and node.get("group"):
            members.setdefault(node["group"], []).append(positions[node["id"]])
    frames = []
    for group, corners in sorted(members.items()):
        left, top = min(x for x, _ in corners) - 5, min(y for _, y in corners) - 5
        right, bottom = max(x for x, _ in corners) + NODE_WIDTH + 5, max(y for _, y in corners) + NODE_HEIGHT + 5
        frames.append(html.Div(
            html.Span(group.rsplit(".", 1)[-1], className="parameter-group-label"), className="parameter-group",
            title=f"parameters of {group}",
            style={"left": f"{left}px", "top": f"{top}px", "width": f"{right - left}px", "height": f"{bottom - top}px"},
            **attributes({"data-group": group, "aria-hidden": "true"})))
    return frames


def _links(edges: list[dict[str, Any]], selected: str | None, role: str | None) -> dict[tuple[str, str], bool]:
    """Neighbours of the selected node -> whether the selected role has the link (thick line)."""
    links: dict[tuple[str, str], bool] = {}
    for edge in edges:
        if edge["target"] == selected:
            key, mine = (edge["source"], "dependency"), edge.get("target_role") == role
        elif edge["source"] == selected:
            key, mine = (edge["target"], "dependent"), edge.get("source_role") == role
        else:
            continue
        links[key] = links.get(key, False) or mine or role is None
    return links


def _position(node: dict[str, Any]) -> tuple[int, int]:
    return (PADDING + int(node.get("column", 0)) * (NODE_WIDTH + COLUMN_GAP),
            PADDING + int(node.get("row", 0)) * (NODE_HEIGHT + ROW_GAP))


def _node(node: dict[str, Any], selected: str | None, dependencies: set[str], dependents: set[str], *,
          has_deps: bool, has_dependents: bool) -> html.Div:
    node_id = node["id"]
    state = ("selected" if node_id == selected else "dependency" if node_id in dependencies
             else "dependent" if node_id in dependents else "")
    classes = ["graph-node", f"role-{node.get('role', 'intermediate')}", state,
               "" if has_deps else "no-dependencies", "" if has_dependents else "no-dependents"]
    left, top = _position(node)
    roles = node.get("roles") or []
    old = node.get("iteration_offset", 0) < 0
    kind = ROLE_NAMES.get(node.get("role", ""), node.get("role", ""))
    aliases = [a for a in node.get("aliases") or [] if isinstance(a, str)]  # tied weights: the other names
    tied = [f"also {', '.join(aliases)}"] if aliases else []
    detail = " · ".join([kind, *(["previous iteration"] if old else []),
                         *([f"{len(roles)} roles"] if len(roles) > 1 else []), *(["tied"] if aliases else [])])
    spoken = ", ".join([node["node"] + (" (previous iteration)" if old else ""), kind,
                        *([f"{len(roles)} roles"] if len(roles) > 1 else []), *tied, *([state] if state else [])])
    return html.Div(
        [html.Span(node["node"], className="node-name"), html.Span(detail, className="node-detail")],
        className=" ".join(c for c in classes if c),
        style={"left": f"{left}px", "top": f"{top}px", "width": f"{NODE_WIDTH}px", "height": f"{NODE_HEIGHT}px"},
        title=f"{node['node']} ({detail}); roles: {', '.join(roles)}"
              + (f"; the same parameter is also named {', '.join(aliases)}" if aliases else ""),
        role="button", tabIndex="0",
        **attributes({"data-node": node_id, "data-node-name": node["node"], "aria-label": spoken,
           "aria-pressed": "true" if state == "selected" else "false"}),
    )


def _line(positions: dict[str, tuple[int, int]], other: str, selected: str, side: str, full: bool) -> html.Div:
    source, target = (other, selected) if side == "dependency" else (selected, other)
    (sx, sy), (tx, ty) = positions[source], positions[target]
    x1, y1 = float(sx + NODE_WIDTH), sy + NODE_HEIGHT / 2
    x2, y2 = float(tx), ty + NODE_HEIGHT / 2
    if tx <= sx:  # a link within a column or backwards: connect the facing edges vertically
        x1, x2 = sx + NODE_WIDTH / 2, tx + NODE_WIDTH / 2
        y1, y2 = (sy + NODE_HEIGHT, ty) if ty > sy else (sy, ty + NODE_HEIGHT)
    length = math.hypot(x2 - x1, y2 - y1)
    angle = math.degrees(math.atan2(y2 - y1, x2 - x1))
    return html.Div(className=f"graph-edge {'full' if full else 'partial'}",
                    style={"left": f"{x1:.1f}px", "top": f"{y1:.1f}px", "width": f"{length:.1f}px",
                           "transform": f"rotate({angle:.2f}deg)"},
                    **attributes({"data-edge": f"{source}->{target}", "data-weight": "full" if full else "partial",
                                  "aria-hidden": "true"}))
