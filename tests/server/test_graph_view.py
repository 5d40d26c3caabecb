"""The graph view: findable nodes, only the selected node's links, dotted borders, thin links."""
from __future__ import annotations

import pytest

from comgra.server.graph_view import COLUMN_GAP, NODE_WIDTH, PADDING, render_graph

GRAPH = {
    "hash": "h1",
    "nodes": [
        {"id": "x", "node": "x", "role": "input", "roles": ["x"], "column": 0, "row": 0},
        {"id": "w", "node": "w", "role": "parameter", "roles": ["weight", "bias"], "column": 0, "row": 1,
         "group": "model.block"},
        {"id": "v", "node": "v", "role": "parameter", "roles": ["v"], "column": 0, "row": 3, "group": "model.block"},
        {"id": "h", "node": "h", "role": "intermediate", "roles": ["h"], "column": 1, "row": 0},
        {"id": "h*old", "node": "h", "role": "intermediate", "roles": ["h"], "column": 0, "row": 2,
         "iteration_offset": -1},
        {"id": "y", "node": "y", "role": "output", "roles": ["y"], "column": 2, "row": 0},
        {"id": "lonely", "node": "lonely", "role": "target", "roles": ["lonely"], "column": 2, "row": 1},
    ],
    "edges": [
        {"source": "x", "source_role": "x", "target": "h", "target_role": "h"},
        {"source": "w", "source_role": "weight", "target": "h", "target_role": "h"},
        {"source": "h*old", "source_role": "h", "target": "h", "target_role": "h"},
        {"source": "h", "source_role": "h", "target": "y", "target_role": "y"},
    ],
}


def walk(component):
    yield component
    children = getattr(component, "children", None)
    if isinstance(children, (list, tuple)):
        for child in children:
            yield from walk(child)
    elif children is not None and hasattr(children, "to_plotly_json"):
        yield from walk(children)


def nodes_of(tree) -> dict[str, dict]:
    return {c.to_plotly_json()["props"]["data-node"]: c.to_plotly_json()["props"]
            for c in walk(tree) if "data-node" in c.to_plotly_json()["props"]}


def edges_of(tree) -> dict[str, str]:
    return {c.to_plotly_json()["props"]["data-edge"]: c.to_plotly_json()["props"]["data-weight"]
            for c in walk(tree) if "data-edge" in c.to_plotly_json()["props"]}


def test_every_node_is_an_element_with_a_name():
    nodes = nodes_of(render_graph(GRAPH, "h", "h"))
    assert set(nodes) == {"x", "w", "v", "h", "h*old", "y", "lonely"}
    assert nodes["h*old"]["aria-label"].startswith("h (previous iteration)")
    assert nodes["h"]["aria-pressed"] == "true" and "selected" in nodes["h"]["aria-label"]
    assert nodes["w"]["data-node-name"] == "w" and "2 roles" in nodes["w"]["aria-label"]


def test_nodes_are_laid_out_by_column_and_row():
    nodes = nodes_of(render_graph(GRAPH, None, None))
    left = {name: pixels(props["style"]["left"]) for name, props in nodes.items()}
    top = {name: pixels(props["style"]["top"]) for name, props in nodes.items()}
    assert left["y"] == PADDING + 2 * (NODE_WIDTH + COLUMN_GAP)
    assert left["x"] == left["w"] == left["v"] == left["h*old"] == PADDING
    assert left["x"] < left["h"] < left["y"] == left["lonely"]
    # Rows 0, 1, 2, 3 of column 0 stack downwards, evenly: numbers, not "12px" < "9px" strings.
    column = [top["x"], top["w"], top["h*old"], top["v"]]
    assert top["x"] == PADDING and column == sorted(column) and len(set(column)) == 4
    assert column[1] - column[0] == column[2] - column[1] == column[3] - column[2] > 0
    assert top["h"] == top["y"] == top["x"] and top["lonely"] == top["w"]


def pixels(value: str) -> float:
    assert value.endswith("px"), value
    return float(value.removesuffix("px"))


def test_only_the_selected_nodes_links_are_drawn_and_its_neighbours_highlighted():
    tree = render_graph(GRAPH, "h", "h")
    assert set(edges_of(tree)) == {"x->h", "w->h", "h*old->h", "h->y"}
    classes = {k: v["className"].split() for k, v in nodes_of(tree).items()}
    assert "selected" in classes["h"] and "dependency" in classes["x"] and "dependent" in classes["y"]
    assert not {"selected", "dependency", "dependent"} & set(classes["lonely"])
    assert set(edges_of(render_graph(GRAPH, "y", "y"))) == {"h->y"}
    assert edges_of(render_graph(GRAPH, None, None)) == {}


@pytest.mark.parametrize("role, weight", [("weight", "full"), ("bias", "partial")])
def test_a_link_only_some_roles_have_is_thin(role, weight):
    assert edges_of(render_graph(GRAPH, "w", role)) == {"w->h": weight}


@pytest.mark.parametrize("node, left_dotted, right_dotted", [
    ("x", True, False), ("h", False, False), ("y", False, True), ("lonely", True, True)])
def test_dotted_borders_mark_missing_dependencies_and_dependents(node, left_dotted, right_dotted):
    classes = nodes_of(render_graph(GRAPH, None, None))[node]["className"].split()
    assert ("no-dependencies" in classes) == left_dotted
    assert ("no-dependents" in classes) == right_dotted


def test_nodes_are_coloured_by_role():
    nodes = nodes_of(render_graph(GRAPH, None, None))
    assert "role-parameter" in nodes["w"]["className"] and "role-input" in nodes["x"]["className"]


def test_no_graph_gives_a_message_not_an_error():
    assert render_graph(None, None, None).children == "No graph to show."


def test_parameters_of_one_module_share_a_frame():
    frames = [c.to_plotly_json()["props"] for c in walk(render_graph(GRAPH, None, None))
              if "data-group" in c.to_plotly_json()["props"]]
    assert [f["data-group"] for f in frames] == ["model.block"]
    nodes = nodes_of(render_graph(GRAPH, None, None))
    top = int(frames[0]["style"]["top"].removesuffix("px"))
    bottom = top + int(frames[0]["style"]["height"].removesuffix("px"))
    assert top < int(nodes["w"]["style"]["top"].removesuffix("px"))
    assert bottom > int(nodes["v"]["style"]["top"].removesuffix("px"))
