"""The graph document the page draws: names, labels, parameter boxes beside their consumer, borders.

Drawing, highlighting and moving along the graph happen in the browser (tests/browser); what they mean
is decided here, in Python, and tested without one."""
from __future__ import annotations

import pytest

from comgra.server.graph_view import LABEL_LIMIT, box_label, client_graph, parameter_box, short_label

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


def nodes_of(graph: dict) -> dict[str, dict]:
    document = client_graph(graph)
    return {n["id"]: n for n in document["nodes"]}


def test_every_node_keeps_its_full_name_and_says_what_it_is():
    nodes = nodes_of(GRAPH)
    assert set(nodes) == {"x", "w", "v", "h", "h*old", "y", "lonely"}
    assert nodes["h*old"]["old"] and nodes["h*old"]["detail"] == "intermediate · previous iteration"
    assert nodes["w"]["name"] == "w" and nodes["w"]["detail"] == "parameter · 2 roles"


@pytest.mark.parametrize("node, has_dependencies, has_dependents", [
    ("x", False, True), ("h", True, True), ("y", True, False), ("lonely", False, False)])
def test_missing_dependencies_and_dependents_are_marked(node, has_dependencies, has_dependents):
    entry = nodes_of(GRAPH)[node]
    assert (entry["has_dependencies"], entry["has_dependents"]) == (has_dependencies, has_dependents)


def test_the_users_visual_group_is_the_box_and_it_sits_beside_its_consumer():
    document = client_graph(GRAPH)
    assert document["boxes"] == [{"id": "model.block", "label": "model.block", "members": ["w", "v"],
                                  "consumer": "h", "column": 0}]
    assert nodes_of(GRAPH)["w"]["box"] == "model.block" and nodes_of(GRAPH)["x"]["box"] is None


def transformer_graph() -> dict:
    names = ["model.blocks.0.attn.q_proj.weight", "model.blocks.0.attn.q_proj.bias", "model.blocks.0.ln1.weight",
             "model.lm_head.weight", "scale"]
    nodes = [{"id": n, "node": n, "role": "parameter", "roles": [n], "column": 0, "row": i, "group": ""}
             for i, n in enumerate(names)]
    nodes += [{"id": t, "node": t, "role": "intermediate", "roles": [t], "column": c, "row": 0}
              for t, c in (("ln1", 1), ("q", 2), ("logits", 3))]
    consumer = {"model.blocks.0.ln1.weight": "ln1", "model.lm_head.weight": "logits", "scale": "logits"}
    edges = [{"source": n, "source_role": n, "target": consumer.get(n, "q"), "target_role": consumer.get(n, "q")}
             for n in names]
    edges += [{"source": "ln1", "source_role": "ln1", "target": "q", "target_role": "q"},
              {"source": "q", "source_role": "q", "target": "logits", "target_role": "logits"}]
    return {"hash": "t", "nodes": nodes, "edges": edges}


def test_without_prefixes_parameters_are_boxed_by_module_beside_the_node_that_uses_them():
    document = client_graph(transformer_graph())
    boxes = {b["id"]: b for b in document["boxes"]}
    assert set(boxes) == {"model.blocks.0.attn.q_proj", "model.blocks.0.ln1", "model.lm_head"}
    assert boxes["model.blocks.0.attn.q_proj"]["consumer"] == "q"
    assert boxes["model.blocks.0.attn.q_proj"]["label"] == "attn.q_proj"
    assert boxes["model.blocks.0.ln1"]["label"] == "blocks.0.ln1" and boxes["model.blocks.0.ln1"]["consumer"] == "ln1"
    nodes = {n["id"]: n for n in document["nodes"]}
    assert nodes["model.blocks.0.attn.q_proj.bias"]["label"] == "bias"  # the box's prefix is dropped inside it
    assert nodes["model.blocks.0.attn.q_proj.bias"]["name"] == "model.blocks.0.attn.q_proj.bias"
    assert nodes["scale"]["box"] is None  # a parameter of no module stands alone


@pytest.mark.parametrize("name, box, label", [
    ("model.blocks.0.mlp.fc1.weight", "model.blocks.0.mlp.fc1", "weight"),
    ("short", None, "short"),
    ("a" * 30 + ".middle." + "b" * 30, None, "a" * 17 + "…" + "b" * 26),
])
def test_labels_drop_the_box_prefix_and_keep_both_ends_of_long_names(name, box, label):
    assert short_label(name, box) == label
    assert len(short_label(name, box)) <= LABEL_LIMIT


def test_only_parameters_get_a_box():
    assert parameter_box({"role": "intermediate", "node": "a.b"}) is None
    assert parameter_box({"role": "parameter", "node": "a.b", "group": ""}) == "a"
    assert parameter_box({"role": "parameter", "node": "a.b", "group": "mine"}) == "mine"
    assert box_label("model.blocks.11.attn") == "blocks.11.attn"


def test_no_graph_gives_no_document():
    assert client_graph(None) is None and client_graph({"nodes": []}) is None
