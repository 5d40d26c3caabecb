"""What a browser test does with the app, and how it checks the page against the store."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect

from comgra.service import parse_aggregation
from comgra.store import GroupReader
from comgra.store import format as fmt

# How long a wait for the page may take: generous, as on a loaded 2-core machine a first page took 10 s and more (a
# wait, never a timing bound: a test of speed measures in benchmarks/). The same for every test's expect().
TIMEOUT = 30_000
READ_PAGE = """() => {
  const field = name => { const e = document.querySelector(`#values [data-field="${name}"]`); return e ? e : null; };
  const text = name => field(name) ? field(name).textContent : null;
  const selected = document.querySelector('#dependency-graph .graph-node.selected');
  return {
    trial: text('trial'), training_step: text('training_step'), iteration: text('iteration'),
    node: text('node'), role: text('role'), kind: text('kind'), aggregation_label: text('aggregation'),
    aggregation: field('aggregation') ? field('aggregation').dataset.value : null,
    tensor_type: text('tensor_type'), type_of_execution: text('type_of_execution'), shape: text('shape'),
    node_id: selected ? selected.dataset.node : null,
    stats: Object.fromEntries(Array.from(document.querySelectorAll('#values [data-stat]'))
                                  .map(e => [e.dataset.stat, [e.dataset.value, e.textContent]])),
    neurons: Array.from(document.querySelectorAll('#values [data-neuron]')).map(e => e.dataset.value),
    graphs: document.querySelectorAll('[data-graph]').length,
    notice: document.getElementById('notice').textContent,
    banner: document.getElementById('banner').textContent,
  };
}"""

SCROLL_GRAPH = """async ([left, top]) => {
  const graph = document.getElementById('dependency-graph');
  graph.scrollLeft = left; graph.scrollTop = top;
  for (let i = 0; i < 2; i++) await new Promise(done => requestAnimationFrame(done));
  return {left: graph.scrollLeft, top: graph.scrollTop, width: graph.clientWidth, height: graph.clientHeight,
          scrollWidth: graph.scrollWidth, scrollHeight: graph.scrollHeight,
          drawn: Array.from(graph.querySelectorAll('[data-node]')).map(e => e.dataset.node)};
}"""


class ComgraPage:
    def __init__(self, page: Page, recording: Path):
        self.page = page
        self.recording = recording
        self.errors: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.set_default_timeout(TIMEOUT)

    def load(self, url: str, ready: str = "#stat-mean") -> None:
        self.page.goto(url)
        self.page.wait_for_selector(ready)
        if ready == "#stat-mean":  # the values come with the graph's key; the page then draws the graph
            self.page.wait_for_selector("#dependency-graph .graph-node.selected")

    # -- actions -----------------------------------------------------------------------------------
    def click_node(self, node_id: str) -> None:
        """Click a node; the graph marks it at once, the values follow from the server: wait for both.

        The graph draws only what is in view: a node out of view is scrolled to first, as a user would."""
        self.reveal(node_id)
        node = self.page.locator(f'#dependency-graph [data-node="{node_id}"]')
        name = node.get_attribute("data-node-name")
        node.click()
        expect(node).to_have_class(has_class("selected"))
        expect(self.field("node")).to_have_text(name)
        self.page.wait_for_function("() => new URLSearchParams(location.search).get('node') === " + repr(node_id))

    def reveal(self, node_id: str) -> None:
        """Scroll the graph to a node (the graph draws it once it is in view), unless it is drawn already."""
        if not self.page.locator(f'#dependency-graph [data-node="{node_id}"]').count():
            self.page.evaluate("id => window.comgraGraph.reveal(id)", node_id)

    def scroll_graph(self, left: float, top: float) -> dict[str, Any]:
        """Scroll the graph's area as a user does (wheel, scroll bars, dragging), wait until the next
        frames are drawn, and return where it stands: scrollLeft, scrollTop, the area's size and the drawn nodes."""
        return self.page.evaluate(SCROLL_GRAPH, [left, top])

    def drawn_nodes(self) -> list[str]:
        return self.page.locator("#dependency-graph [data-node]").evaluate_all("els => els.map(e => e.dataset.node)")

    def choose(self, dropdown: str, label: str) -> None:
        self.page.click(f"#{dropdown}")
        self.page.locator(".dash-dropdown-option", has_text=label).first.click()
        expect(self.page.locator(f"#{dropdown}")).to_contain_text(label)

    def field(self, name: str) -> Any:
        return self.page.locator(f'#values [data-field="{name}"]')

    def wait_for(self, **fields: Any) -> None:
        for name, value in fields.items():
            expect(self.field(name)).to_have_text(str(value))

    def read(self) -> dict[str, Any]:
        return self.page.evaluate(READ_PAGE)

    # -- checks ------------------------------------------------------------------------------------
    def expected_row(self, shown: dict[str, Any]) -> dict[str, Any]:
        """The store's row for what the page says it shows, found without asking the app."""
        trial = GroupReader(self.recording).trial(shown["trial"])
        step, iteration = int(shown["training_step"]), int(shown["iteration"])
        # A step is (number, type): an evaluation may share a training step's number.
        (index_row,) = [r for r in trial.steps().to_pylist() if r["training_step"] == step
                        and r["iteration"] == iteration and r["type_of_execution"] == shown["type_of_execution"]]
        (node,) = [n for n in trial.graph(index_row["graph"])["nodes"] if n["id"] == shown["node_id"]]
        data_iteration = node["absolute_iteration"]
        if data_iteration is None:
            data_iteration = iteration + node["iteration_offset"]
        aggregation, sample = parse_aggregation(shown["aggregation"])
        rows = trial.selection(training_step=step, kind=shown["kind"], iteration=data_iteration, node=node["node"],
                               role=shown["role"], aggregation=aggregation, sample=sample,
                               type_of_execution=index_row["type_of_execution"]).to_pylist()
        assert len(rows) == 1, (shown, rows)
        assert shown["node"] == node["node"] and shown["type_of_execution"] == index_row["type_of_execution"]
        return rows[0]

    def check_against_store(self) -> dict[str, Any]:
        """Assert that every number shown equals the store's; returns what the page shows."""
        shown = self.read()
        assert shown["graphs"] == 1, "exactly one graph (the current iteration's) is in the page"
        assert "Traceback" not in shown["banner"] and not self.errors, (shown["banner"], self.errors)
        row = self.expected_row(shown)
        svd = row["svd_max"]
        names = [*fmt.STATISTICS, *(["svd_max"] if svd is not None and not math.isnan(svd) else [])]
        assert sorted(shown["stats"]) == sorted(names)
        for name in names:
            assert _same(shown["stats"][name][0], row[name]), (name, shown["stats"][name], row[name])
        assert [float(v) for v in shown["neurons"]] == row["neurons"]  # exact: the page carries repr()
        assert shown["tensor_type"] == row["tensor_type"]
        assert shown["shape"] == ("scalar" if row["shape"] == [] else " × ".join(map(str, row["shape"])))
        return shown


def _same(text: str, value: float | None) -> bool:
    if value is None:
        return text == "None"
    shown = float(text)
    return (math.isnan(shown) and math.isnan(value)) or shown == value


def has_class(class_name: str) -> re.Pattern[str]:
    """For ``expect(...).to_have_class``: the element has this class among others."""
    return re.compile(rf"(^|\s){re.escape(class_name)}(\s|$)")
