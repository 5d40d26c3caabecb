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


DRAWN_NODES = """() => Array.from(document.querySelectorAll('#dependency-graph [data-node]')).map(e => {
  const graph = document.getElementById('dependency-graph').getBoundingClientRect(), node = e.getBoundingClientRect();
  return [e.dataset.node, e.dataset.nodeName, e.getAttribute('aria-label'),
          Math.max(graph.left - node.right, node.left - graph.right, graph.top - node.bottom, node.top - graph.bottom)];
})"""
MARGIN = 300  # px: assets/comgra.js draws this much beyond each side of the visible part (DRAW_MARGIN)


def drawn(app) -> list[tuple[str, str, str, float]]:
    """The node elements in the page: id, full name, aria-label, and how far (px) outside the graph's visible area."""
    return [tuple(n) for n in app.page.evaluate(DRAWN_NODES)]


def nodes_seen_by_scrolling(app) -> dict[str, tuple[str, str]]:
    """Every node drawn at some scroll position, moving one view at a time: id -> (full name, aria-label)."""
    seen: dict[str, tuple[str, str]] = {}
    area = app.scroll_graph(0, 0)
    for top in range(0, int(area["scrollHeight"]), int(area["height"])):
        for left in range(0, int(area["scrollWidth"]), int(area["width"])):
            at = app.scroll_graph(left, top)
            assert (at["left"], at["top"]) == (min(left, at["scrollWidth"] - at["width"]),
                                               min(top, at["scrollHeight"] - at["height"])), (left, top, at)
            seen.update({node: (name, label) for node, name, label, _ in drawn(app)})
    return seen


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
    names = nodes_seen_by_scrolling(app)  # only what is in view is drawn: scroll over the whole graph
    assert sorted(names) == sorted(n["id"] for n in graph["nodes"])
    assert all(label.startswith(name) for name, label in names.values())  # the full name, for screen readers
    app.reveal("block2.q")
    box = app.page.locator('[data-group="model.blocks.2.attn.q_proj"]')
    expect(box).to_contain_text("attn.q_proj")
    weight = app.page.locator('[data-node="model.blocks.2.attn.q_proj.weight"]')
    expect(weight.locator(".node-name")).to_have_text("weight")  # the box's prefix is dropped inside it
    # Both boxes read in one frame: the page above the graph may still grow (a callback's answer) between two reads.
    consumer, frame = app.page.evaluate("""() => ['[data-node="block2.q"]', '[data-group="model.blocks.2.attn.q_proj"]']
      .map(s => { const r = document.querySelector(s).getBoundingClientRect(); return {x: r.x, y: r.y}; })""")
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


def test_a_thousand_nodes_draw_only_what_is_in_view_and_the_far_right_end_answers_clicks(serve, open_page, huge):
    graph = first_graph(huge)
    assert len(graph["nodes"]) >= 1000
    app = open_page(serve(huge), huge)
    area = app.scroll_graph(0, 0)
    assert area["scrollWidth"] > 20 * area["width"]  # far wider than the view: most of it is not drawn
    at_start = drawn(app)
    assert "input" in {n[0] for n in at_start}
    selected = app.read()["node_id"]
    assert all(distance <= MARGIN + 1 for node, _, _, distance in at_start if node != selected), at_start
    # The view holds a few columns of a few nodes each; the graph shows about 500 of its nodes (boxes closed).
    assert len(at_start) < 120, len(at_start)

    # The far right end: the rightmost column's top node, drawn once scrolled to, and a click shows its values.
    rightmost = max(graph["nodes"], key=lambda n: (n["column"], -n["row"]) if n["role"] != "parameter" else (-1, 0))
    area = app.scroll_graph(area["scrollWidth"], 0)
    assert area["left"] + area["width"] >= area["scrollWidth"] - 1
    at_end = drawn(app)
    assert rightmost["id"] in {n[0] for n in at_end} and in_view(app, rightmost["id"])
    assert all(distance <= MARGIN + 1 for node, _, _, distance in at_end if node != selected), at_end
    assert len(at_end) < 120
    # what was drawn at the left end is gone, except the selected node (it keeps the keyboard's place)
    assert {n[0] for n in at_start} & {n[0] for n in at_end} == {selected}
    app.page.locator(f'#dependency-graph [data-node="{rightmost["id"]}"]').click()
    expect(app.page.locator(f'#dependency-graph [data-node="{rightmost["id"]}"]')).to_have_class(has_class("selected"))
    app.wait_for(node=rightmost["node"])
    shown = app.check_against_store()
    assert shown["node_id"] == rightmost["id"]
    # its dependencies are marked where they are drawn, and the ones drawn later are marked when drawn
    dependency = next(e["source"] for e in graph["edges"] if e["target"] == rightmost["id"])
    app.reveal(dependency)
    expect(app.page.locator(f'#dependency-graph [data-node="{dependency}"]')).to_have_class(has_class("dependency"))
    app.page.click("#nav-left")  # moving along the graph still works from the far end
    selected = app.page.locator("#dependency-graph .graph-node.selected")
    expect(selected).not_to_have_attribute("data-node", rightmost["id"])
    app.wait_for(node=selected.get_attribute("data-node-name"))
    app.check_against_store()
    assert not app.errors
