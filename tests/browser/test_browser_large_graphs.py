"""Transformer-shaped graphs in Chromium: every node findable, clicks show the store's numbers, the view
lives in the URL (a reload keeps it, a link opens it), and a 1,000-node graph stays usable."""
from __future__ import annotations

import pytest
from comgra_page import has_class
from playwright.sync_api import expect

from comgra.service import view_link
from comgra.store import GroupReader

TRIAL = "trial_bugged_original_version"


@pytest.fixture(scope="module")
def transformer(tmp_path_factory, synthetic):
    """About 130 nodes: 4 blocks of attention + MLP, a node per parameter (the recorder's default)."""
    options = synthetic.Options(scale=0.02, trials=1, steps_per_chunk=2, nodes=130)
    return synthetic.write_recording(tmp_path_factory.mktemp("transformer"), options)


@pytest.fixture(scope="module")
def huge(tmp_path_factory, synthetic):
    options = synthetic.Options(scale=0.01, trials=1, steps_per_chunk=2, nodes=1000, distinct_steps=1)
    return synthetic.write_recording(tmp_path_factory.mktemp("huge"), options)


def first_graph(recording) -> dict:
    trial = GroupReader(recording).trial(TRIAL)
    return trial.graph(trial.steps().to_pylist()[0]["graph"])


def in_view(app, node_id: str) -> bool:
    """Whether the node is inside the visible part of the graph's scroll area."""
    return app.page.evaluate("""id => {
      const graph = document.getElementById('dependency-graph').getBoundingClientRect();
      const node = document.querySelector(`#dependency-graph [data-node="${id}"]`).getBoundingClientRect();
      return node.left >= graph.left && node.right <= graph.right && node.top >= graph.top && node.bottom <= graph.bottom;
    }""", node_id)


def search(app, name: str, node_id: str) -> None:
    app.page.click("#node-search")
    app.page.keyboard.type(name)
    app.page.locator(".dash-dropdown-option", has_text=name).first.click()
    expect(app.page.locator(f'#dependency-graph [data-node="{node_id}"]')).to_have_class(has_class("selected"))
    app.wait_for(node=name)


def test_every_node_is_findable_by_name_and_parameters_sit_in_module_boxes(serve, open_page, transformer):
    graph = first_graph(transformer)
    assert len(graph["nodes"]) > 100
    app = open_page(serve(transformer), transformer)
    names = app.page.locator("#dependency-graph [data-node]").evaluate_all(
        "els => els.map(e => [e.dataset.node, e.dataset.nodeName, e.getAttribute('aria-label')])")
    assert sorted(n[0] for n in names) == sorted(n["id"] for n in graph["nodes"])
    assert all(label.startswith(name) for _, name, label in names)  # the full name, for screen readers and tests
    box = app.page.locator('[data-group="model.blocks.2.attn.q_proj"]')
    expect(box).to_contain_text("attn.q_proj")
    weight = app.page.locator('[data-node="model.blocks.2.attn.q_proj.weight"]')
    expect(weight.locator(".node-name")).to_have_text("weight")  # the box's prefix is dropped inside it
    consumer = app.page.locator('[data-node="block2.q"]').bounding_box()
    frame = box.bounding_box()
    assert abs(frame["x"] - consumer["x"]) < 1 and 0 < frame["y"] - consumer["y"] < 80  # right under its consumer
    for node in ("model.blocks.3.mlp.fc2.bias", "block1.attention", "loss"):
        search(app, node, node)
        app.check_against_store()
        assert in_view(app, node)


def test_clicks_far_and_near_show_the_stores_numbers(serve, open_page, transformer):
    app = open_page(serve(transformer), transformer)
    for node in ("block0.q", "model.blocks.0.attn.q_proj.weight", "block3.residual2", "logits", "loss_per_sample"):
        app.click_node(node)
        shown = app.check_against_store()
        assert shown["node_id"] == node
    edges = app.page.locator("[data-edge]").evaluate_all("els => els.map(e => e.dataset.edge)")
    assert sorted(edges) == ["logits->loss_per_sample", "loss_per_sample->loss", "target->loss_per_sample"]
    assert not app.errors


def test_a_reload_keeps_the_view_and_a_link_opens_the_one_it_names(serve, open_page, transformer):
    url = serve(transformer)
    app = open_page(url, transformer)
    app.click_node("block1.fc1")
    app.choose("aggregation-select", "Sample 2")
    app.wait_for(aggregation="Sample 2")
    app.page.get_by_role("option", name="gradients").click()
    app.wait_for(kind="gradients")
    app.page.wait_for_function("() => location.search.includes('kind=gradients')")
    before = app.check_against_store()
    app.page.reload()
    app.page.wait_for_selector("#stat-mean")
    app.wait_for(node="block1.fc1", aggregation="Sample 2", kind="gradients")
    assert app.check_against_store() == before

    steps = sorted({r["training_step"] for r in GroupReader(transformer).trial(TRIAL).steps().to_pylist()})
    link = view_link(TRIAL, training_step=steps[-1], node_id="model.blocks.3.ln2.weight", kind="gradients")
    other = open_page(url.rstrip("/") + link, transformer)
    other.wait_for(node="model.blocks.3.ln2.weight", training_step=steps[-1], kind="gradients",
                   aggregation="No batch dimension")
    other.check_against_store()
    assert in_view(other, "model.blocks.3.ln2.weight")
    assert other.page.locator("#notice").text_content() == ""  # nothing had to change

    notes = open_page(url.rstrip("/") + view_link(TRIAL, tab="notes"), transformer, ready="#panel-notes .note")
    expect(notes.page.locator("#panel-tensors")).to_be_hidden()


def test_a_graph_of_a_thousand_nodes_stays_usable(serve, open_page, huge):
    graph = first_graph(huge)
    assert len(graph["nodes"]) >= 1000
    app = open_page(serve(huge), huge)
    expect(app.page.locator("#dependency-graph .graph-node")).not_to_have_count(0)
    # Boxes start closed: the graph is a few hundred elements, not a thousand.
    assert app.page.locator("#dependency-graph [data-node]").count() < 0.6 * len(graph["nodes"])
    deep = "model.blocks.30.mlp.fc2.weight"
    search(app, deep, deep)  # a parameter in a closed box, far to the right: opened and scrolled into view
    app.check_against_store()
    assert in_view(app, deep)
    app.click_node("block30.fc2")
    app.check_against_store()
    assert in_view(app, "block30.fc2")
    app.page.click("#nav-right")
    expect(app.page.locator('#dependency-graph [data-node="block30.residual2"]')).to_have_class(has_class("selected"))
    app.wait_for(node="block30.residual2")
    app.check_against_store()
    app.page.locator('[data-zoom-step="fit"]').click()
    assert float(app.page.locator("#dependency-graph").get_attribute("data-zoom")) < 0.5
    assert not app.errors
