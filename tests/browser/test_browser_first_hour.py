"""A newcomer's first hour on the tutorial, at 1280x800 (issue 25): the Findings tab's details open where the
finding is, with the steps the message counts flagged, and its link plots the finding's statistic."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

pytest.importorskip("torch")
from comgra.analysis import Scanner  # noqa: E402
from comgra.examples.tutorial import TRIAL_BUGGED, run_tutorial  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

VIEWPORT = {"width": 1280, "height": 800}
expect.set_options(timeout=20_000)  # a loaded 2-core machine

FLAGGED = """el => {
  const trace = el.querySelector('.js-plotly-plot')._fullData.find(t => (t.name || '').startsWith('flagged'));
  return trace ? [Array.from(trace.x), Array.from(trace.y)] : [[], []];
}"""


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # What `comgra demo` records by default (--steps 300, its layers profiled): the start-here path must work on the
    # demo.
    return run_tutorial(tmp_path_factory.mktemp("first-hour"), steps=300, min_training_steps_difference=120,
                        progress=False, profile=True)


@pytest.fixture
def small_page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_default_timeout(20_000)
    yield page
    context.close()
    assert errors == []


def test_details_open_at_the_finding_flag_its_steps_and_link_its_statistic(serve, small_page, tutorial) -> None:
    findings = Scanner().scan(tutorial).findings
    finding = next(f for f in findings if f.detector == "one_sided" and f.trial == TRIAL_BUGGED
                   and f.node == "subnet_out__out")
    assert finding.statistic == "min" and len(finding.steps) > 1
    page = small_page
    page.goto(serve(tutorial) + "?tab=findings")
    items = page.locator("#findings-list .finding")
    expect(page.locator("#findings-count")).to_have_text(f"{len(findings)} findings")  # the scan is done
    expect(items).to_have_count(len(findings))
    page.wait_for_timeout(1500)  # the last poll's redraw, if one was under way
    item = items.nth(findings.index(finding))
    # The last finding's details too: the list is longer than the window, the details open in view.
    for shown in (item, items.last):
        shown.scroll_into_view_if_needed()
        shown.get_by_role("button", name="Details").click()
        expect(shown.locator(".findings-detail .finding-series")).to_be_in_viewport()
    series = item.locator(".findings-detail .finding-series")
    # Every step the finding names is flagged in the plot (the plot was at one iteration: 1 of them).
    page.wait_for_function("el => el.querySelector('.js-plotly-plot') && el.querySelector('.js-plotly-plot').data",
                           arg=series.element_handle())
    steps, values = series.evaluate(FLAGGED)
    assert steps == finding.steps
    # Each flagged point is the step's min over the iterations the node was recorded at, as the store has it.
    trial = GroupReader(tutorial).trial(finding.trial)
    for step, value in zip(steps, values):
        rows = trial.selection(training_step=step, node=finding.node, role=finding.role, kind=finding.kind,
                               aggregation="mean", sample=-1).to_pylist()
        assert rows and value == min(row["min"] for row in rows)
    expect(series).to_contain_text(f"flagged ({len(finding.steps)})")
    # Evidence rounded for reading: 4 significant digits, the JSON keeps them all.
    evidence = item.locator(".finding-evidence")
    expect(evidence).to_contain_text(f"ratio: {finding.evidence['ratio']:.4g}")
    assert str(finding.evidence["ratio"]) not in evidence.inner_text() or len(str(finding.evidence["ratio"])) <= 6
    # A second click closes the details.
    items.last.get_by_role("button", name="Details").click()
    expect(items.last.locator(".findings-detail .finding-series")).to_have_count(0)
    # Open in Tensors plots the finding's statistic ("min"), not "mean".
    item.get_by_role("link", name="Open in Tensors").click()
    page.wait_for_selector("#stat-mean")
    expect(page.locator("#statistic-select")).to_contain_text("min")
    expect(page.locator("#series-plot")).to_contain_text(f"min of {finding.node}")


LABELS = """() => Array.from(document.querySelectorAll('#dependency-graph .graph-node .node-name')).map(el => {
  const range = document.createRange();
  range.selectNodeContents(el);
  const glyphs = Array.from(range.getClientRects());
  const node = el.closest('.graph-node');
  const inner = node.getBoundingClientRect().bottom - parseFloat(getComputedStyle(node).borderBottomWidth);
  return {name: el.textContent, lines: new Set(glyphs.map(r => Math.round(r.top))).size,
          glyphs_bottom: Math.max(...glyphs.map(r => r.bottom)),
          clip_bottom: Math.min(el.getBoundingClientRect().bottom, inner),
          scroll_width: el.scrollWidth, client_width: el.clientWidth};
})"""


def test_node_labels_keep_their_underscores_at_device_pixel_ratio_1(serve, small_page, tutorial) -> None:
    """The label's line box was shorter than the font's ascent + descent: at device-pixel-ratio 1 the last
    line's underscores fell outside it and were clipped ("helper partial sums")."""
    page = small_page
    assert page.evaluate("window.devicePixelRatio") == 1
    page.goto(serve(tutorial))
    page.wait_for_selector("#dependency-graph .graph-node.selected")
    page.wait_for_selector('#dependency-graph [data-node="helper_partial_sums"]')
    labels = page.evaluate(LABELS)
    assert any(label["name"] == "helper_partial_sums" for label in labels)
    for label in labels:
        assert label["scroll_width"] <= label["client_width"], label
        if label["lines"] <= 2:  # longer names are cut to two lines on purpose (the hover card has them)
            assert label["glyphs_bottom"] <= label["clip_bottom"] + 0.01, label


IN_VIEW = """() => {
  const pane = document.getElementById('dependency-graph').getBoundingClientRect();
  const state = window.comgraGraph.state;
  const out = [];
  for (const node of state.doc.nodes) {
    const p = state.layout.nodes[node.id];
    if (!p || p.hidden) continue;
    const el = document.querySelector(`#dependency-graph [data-node="${CSS.escape(node.id)}"]`);
    const box = el ? el.getBoundingClientRect() : null;
    if (!box || box.left < pane.left - 0.5 || box.right > pane.right + 0.5 || box.top < pane.top - 0.5
        || box.bottom > pane.bottom + 0.5) out.push(node.id);
  }
  return {outside: out, pane_bottom: pane.bottom, zoom: state.zoom, nodes: state.doc.nodes.length,
          selected: state.selected};
}"""


def _longest_type(group: Path) -> tuple[str, int]:
    import pyarrow.compute as pc

    steps = GroupReader(group).trial(TRIAL_BUGGED).steps()
    last = pc.max(steps["iteration"]).as_py()
    return steps.filter(pc.equal(steps["iteration"], last)).to_pylist()[0]["type_of_execution"], last


def test_the_graph_fits_the_pane_and_the_pane_fits_the_window(serve, small_page, tutorial) -> None:
    """At the tutorial's last iteration "output" was cut and loss_per_sample and loss were off-screen, while
    the lower half of the pane was empty and its bottom below the window's edge."""
    type_of_execution, last = _longest_type(tutorial)
    page = small_page
    page.goto(serve(tutorial) + f"?trial={TRIAL_BUGGED}&type={type_of_execution}&iteration={last}"
              "&node=subnet_out__out")
    page.wait_for_selector('#dependency-graph .graph-node.selected[data-node="subnet_out__out"]')
    page.wait_for_selector('#dependency-graph [data-node="loss"]')
    shown = page.evaluate(IN_VIEW)
    assert {"output", "loss_per_sample", "loss"} <= {n["id"] for n in page.evaluate(
        "() => window.comgraGraph.state.doc.nodes")}
    assert shown["outside"] == [] and shown["selected"] == "subnet_out__out", shown
    assert shown["pane_bottom"] <= VIEWPORT["height"] and 0.5 <= shown["zoom"] < 1, shown
    # Another structure (the first iteration): fitted again, the selection kept in view.
    page.focus("#iteration-slider [role=slider]")
    page.keyboard.press("Home")
    expect(page.locator('#values [data-field="iteration"]')).to_have_text("0")
    page.wait_for_function("() => !window.comgraGraph.state.doc.nodes.some(n => n.id === 'loss')")
    shown = page.evaluate(IN_VIEW)
    assert shown["outside"] == [] and shown["pane_bottom"] <= VIEWPORT["height"], shown


SERIES = """() => document.querySelector('#series-plot .js-plotly-plot')._fullData  // typed arrays decoded
  .filter(t => t.name && t.mode && t.mode.includes('lines')).map(t => [t.name, Array.from(t.x), Array.from(t.y)])"""


def test_start_here_leads_from_the_finding_to_the_node_to_the_plot(serve, small_page, tutorial) -> None:
    from comgra.server.start_here import guide_finding

    sys.path.insert(0, str(Path(__file__).parent))
    from comgra_page import ComgraPage

    finding = guide_finding(Scanner().scan(tutorial).findings)
    assert finding is not None and finding.node == "subnet_out__out" and finding.trial == TRIAL_BUGGED
    url = serve(tutorial)
    page = small_page
    page.goto(url)
    strip = page.locator(".start-here-box")
    expect(strip).to_be_in_viewport()
    labels = ["The finding", "The node that shows it", "The plot that proves it"]
    assert strip.locator(".start-here-link").all_inner_texts() == labels
    for step in strip.locator(".start-here-step").all():
        assert step.evaluate("el => el.scrollWidth <= el.clientWidth"), step.inner_text()
    # 1: the finding, first in the Findings tab.
    strip.get_by_role("link", name=labels[0]).click()
    first = page.locator("#findings-list .finding").first
    expect(first).to_be_in_viewport()
    assert (first.get_attribute("data-node"), first.get_attribute("data-detector")) == (finding.node, finding.detector)
    # 2: the node that shows it, selected at the finding's step, with the store's numbers.
    page.goto(url)
    page.locator(".start-here-box").get_by_role("link", name=labels[1]).click()
    app = ComgraPage(page, tutorial)
    app.wait_for(node=finding.node, training_step=finding.training_step)
    expect(page.locator('#dependency-graph .graph-node.selected[data-node="subnet_out__out"]')).to_be_in_viewport()
    assert app.check_against_store()["node_id"] == finding.node
    # 3: the plot that proves it: the finding's statistic across steps, one curve per trial, in view, equal to the store.
    page.goto(url)
    page.locator(".start-here-box").get_by_role("link", name=labels[2]).click()
    expect(page.locator("#series-plot")).to_contain_text(f"min of {finding.node}")
    expect(page.locator("#series-plot .js-plotly-plot")).to_be_in_viewport()
    shown = app.read()
    page.wait_for_function("() => document.querySelector('#series-plot .js-plotly-plot').data.length >= 2")
    curves = {name: (x, y) for name, x, y in page.evaluate(SERIES)}
    reader = GroupReader(tutorial)
    assert set(curves) == set(reader.trials())
    for trial, (x, y) in curves.items():
        table = reader.trial(trial).series(node=finding.node, role=finding.role, kind=finding.kind,
                                           iteration=int(shown["iteration"]), aggregation="mean", statistic="min")
        assert x == table["training_step"].to_pylist() and y == table["value"].to_pylist()
    # The bug in one plot: the bugged trial's output layer stays (almost) non-negative, the fixed one's does not.
    assert min(curves[TRIAL_BUGGED][1]) > min(min(v) for t, (_, v) in curves.items() if t != TRIAL_BUGGED)
    # Closed, it stays closed.
    page.goto(url)
    page.locator(".start-here-close").click()
    expect(page.locator(".start-here-box")).to_have_count(0)
    page.reload()
    page.wait_for_selector("#stat-mean")
    page.wait_for_timeout(1500)
    expect(page.locator(".start-here-box")).to_have_count(0)


DISTRIBUTION = """() => document.querySelector('#distribution-plot .js-plotly-plot')._fullData
  .filter(t => t.name === 'median').map(t => [t.legendgroup, Array.from(t.x), Array.from(t.y)])"""


def test_the_distribution_across_steps_shows_every_trial_side_by_side(serve, small_page, tutorial) -> None:
    import numpy as np

    from comgra.service.distributions import PERCENTILES

    page = small_page
    page.goto(serve(tutorial) + f"?trial={TRIAL_BUGGED}&node=subnet_pre__hidden_state")
    page.wait_for_selector('#dependency-graph .graph-node.selected[data-node="subnet_pre__hidden_state"]')
    page.locator("#distribution-plot").scroll_into_view_if_needed()  # drawn only in view (issue 34)
    page.locator("#distribution-plot .js-plotly-plot .main-svg").first.wait_for()
    iteration = int(page.locator('#values [data-field="iteration"]').inner_text())
    medians = {trial: (x, y) for trial, x, y in page.evaluate(DISTRIBUTION)}
    reader = GroupReader(tutorial)
    assert set(medians) == set(reader.trials())
    for trial, (steps, values) in medians.items():
        rows = reader.trial(trial).values_series(node="subnet_pre__hidden_state", role="subnet_pre__hidden_state",
                                                 iteration=iteration).to_pylist()
        pooled: dict[int, list[float]] = {}
        for row in rows:
            pooled.setdefault(row["training_step"], []).extend(row["neurons"])
        assert steps == sorted(pooled)
        assert np.allclose(values, [np.percentile(pooled[s], PERCENTILES[4]) for s in steps])
    for title in page.locator("#distribution-plot .annotation-text").all():  # the trials' names are not cut
        assert title.bounding_box()["width"] > 0


def test_shortcuts_dark_mode_and_csv_downloads(serve, browser, tutorial) -> None:
    import csv
    import io

    context = browser.new_context(viewport=VIEWPORT, color_scheme="dark", accept_downloads=True)
    try:
        page = context.new_page()
        page.set_default_timeout(20_000)
        url = serve(tutorial)
        page.goto(url + f"?trial={TRIAL_BUGGED}")
        page.wait_for_selector("#dependency-graph .graph-node.selected")
        # Dark mode follows the system's preference.
        assert page.evaluate("document.documentElement.getAttribute('data-bs-theme')") == "dark"
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert sum(int(c) for c in background[background.index("(") + 1:-1].split(",")[:3]) < 150, background
        # n / p: next and previous recorded step; / : the node search; ? and Escape: the list of shortcuts.
        steps = sorted(set(GroupReader(tutorial).trial(TRIAL_BUGGED).steps()["training_step"].to_pylist()))
        step = page.locator('#values [data-field="training_step"]')
        expect(step).to_have_text(str(steps[0]))
        page.locator("body").click(position={"x": 5, "y": 790})
        page.keyboard.press("n")
        expect(step).to_have_text(str(steps[1]))
        page.keyboard.press("p")
        expect(step).to_have_text(str(steps[0]))
        page.keyboard.press("?")
        expect(page.locator("#shortcut-help")).to_be_in_viewport()
        expect(page.locator("#shortcut-help")).to_contain_text("next recorded step")
        page.keyboard.press("Escape")
        expect(page.locator("#shortcut-help")).to_have_count(0)
        page.keyboard.press("/")
        page.wait_for_function("() => document.activeElement.classList.contains('dash-dropdown-search')")
        page.keyboard.type("loss_per")  # typed into the node search, without the "/"
        assert page.evaluate("document.activeElement.value") == "loss_per"
        page.keyboard.press("Escape")
        # The KPI curves as CSV: the store's points of the trial shown.
        page.goto(url + f"?tab=graphs&trial={TRIAL_BUGGED}")
        page.wait_for_selector("#kpi-graphs [data-kpi-group]")
        with page.expect_download() as download:
            page.click("#kpi-csv")
        rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
        kpis = GroupReader(tutorial).trial(TRIAL_BUGGED).kpis().to_pylist()
        assert len(rows) == len(kpis) and {r["trial"] for r in rows} == {TRIAL_BUGGED}
        assert sorted((r["kpi_name"], int(r["training_step"]), float(r["value"])) for r in rows) == \
            sorted((k["kpi_name"], k["timepoint"], k["value"]) for k in kpis)
        # The Compare table as CSV, numbers at full precision.
        page.goto(url + f"?tab=compare&trial={TRIAL_BUGGED}")
        page.click("text=Pin the shown selection")
        page.wait_for_selector("#compare-table")
        with page.expect_download() as download:
            page.click(".compare-csv")
        table = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
        shown = {row[0]: row[1:] for row in table[1:]}
        mean = page.locator('#compare-table [data-side="pinned"][data-stat="mean"]').get_attribute("data-value")
        assert shown["mean"][0] == mean and float(mean) == float(mean)
        # The Samples table has its CSV download button (test_browser_samples.py checks the file).
        page.goto(url + f"?tab=samples&trial={TRIAL_BUGGED}")
        expect(page.locator("#samples-csv")).to_have_count(1)
    finally:
        context.close()
