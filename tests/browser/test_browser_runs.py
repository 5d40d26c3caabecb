"""The Runs tab over a real recorded sweep, in Chromium at 1280x800: the rows and numbers the store holds, the
regex filter, sorting, grouping over seeds, parallel coordinates, and ticked trials opened in Graphs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from comgra_page import ComgraPage
from playwright.sync_api import expect

from comgra.service import RecordingService

SLOW = 30_000
ROWS = "#runs-grid .ag-center-cols-container .ag-row"
CELL = "#runs-grid .ag-row[row-id='{trial}'] [col-id='{column}']"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from tests.runs.sweep_recording import record_sweep

    return record_sweep(tmp_path_factory.mktemp("runs") / "store")


@pytest.fixture
def runs_page(browser, serve, sweep):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    app = ComgraPage(context.new_page(), sweep)
    app.page.set_default_timeout(SLOW)  # eight engineers share two cores here
    app.load(serve(sweep), ready="#tabs")
    app.page.get_by_role("tab", name="Runs").click()
    expect(app.page.locator(ROWS)).to_have_count(4, timeout=SLOW)
    yield app
    assert not app.errors
    context.close()


def _shown_trials(page) -> list[str]:
    return page.eval_on_selector_all(ROWS, "rows => rows.sort((a, b) => a.getBoundingClientRect().top - "
                                           "b.getBoundingClientRect().top).map(r => r.getAttribute('row-id'))")


def test_each_trial_is_a_row_with_the_numbers_of_the_store(runs_page, sweep) -> None:
    page = runs_page.page
    service = RecordingService(sweep)
    try:
        expected = {r.trial: r for r in service.runs().runs}
    finally:
        service.close()
    for trial, run in expected.items():
        cell = page.locator(CELL.format(trial=trial, column="status"))
        expect(cell).to_have_text(run.status)
        expect(page.locator(CELL.format(trial=trial, column="steps"))).to_have_text(str(run.steps))
        best = page.locator(CELL.format(trial=trial, column="kpi:loss/train:best"))
        best.scroll_into_view_if_needed()
        assert float(best.inner_text()) == pytest.approx(run.kpis["loss/train"]["best"], rel=1e-3)
        lr = page.locator(CELL.format(trial=trial, column="hp:lr"))
        lr.scroll_into_view_if_needed()
        assert float(lr.inner_text()) == run.hyperparameters["lr"]
    expect(page.locator(CELL.format(trial="lr1.0_seed0", column="status"))).to_have_text("crashed")


def test_the_regex_filter_and_sorting_work_in_the_browser(runs_page) -> None:
    page = runs_page.page
    page.fill("#runs-filter", "lr=0\\.1$")
    expect(page.locator(ROWS)).to_have_count(2)
    expect(page.locator("#runs-count")).to_have_text("2 of 4 trials")
    assert sorted(_shown_trials(page)) == ["lr0.1_seed0", "lr0.1_seed1"]
    page.fill("#runs-filter", "(")
    expect(page.locator("#runs-filter-notice")).to_contain_text("Not a regular expression")
    expect(page.locator(ROWS)).to_have_count(4)
    page.fill("#runs-filter", "")
    header = page.locator("#runs-grid .ag-header-cell[col-id='steps']")
    header.click()
    header.click()  # descending
    page.wait_for_function("() => document.querySelector(\"#runs-grid .ag-header-cell[col-id='steps']\")"
                           ".getAttribute('aria-sort') === 'descending'")
    assert _shown_trials(page)[-1] == "lr1.0_seed0"  # 2 steps, the others 4


def test_grouping_over_seeds_and_parallel_coordinates(runs_page) -> None:
    page = runs_page.page
    expect(page.locator("#runs-plots")).to_contain_text("Press 'Draw the plots'", timeout=SLOW)  # when asked
    # No graph in the panel until then: a graph loads plotly.js, which held the table's first rows back.
    expect(page.locator("#panel-runs .js-plotly-plot")).to_have_count(0)
    page.click("#runs-draw")
    page.click("#runs-group-by")
    page.locator(".dash-dropdown-option").get_by_text("lr", exact=True).click()
    bands = page.locator("#runs-bands .scatterlayer .trace")
    expect(bands).to_have_count(6, timeout=SLOW)  # lr 0.01, 0.1 and 1.0: a band and a mean line each
    legend = page.locator("#runs-bands .legendtext")
    expect(legend.filter(has_text="lr=0.1 (2 trials)")).to_have_count(1)
    axes = page.locator("#runs-parallel .parcoords .y-axis .axis-title")
    expect(axes).to_have_count(5, timeout=SLOW)  # lr, model.width, optimizer, seed and the KPI
    titles = page.eval_on_selector_all("#runs-parallel .parcoords .y-axis .axis-title", "e => e.map(t => t.textContent)")
    assert titles == ["lr", "model.width", "optimizer", "seed", "accuracy/val (best)"]


def test_ticked_trials_open_in_graphs(runs_page) -> None:
    page = runs_page.page
    for trial in ("lr0.1_seed0", "lr0.01_seed0"):
        page.locator(f"#runs-grid .ag-pinned-left-cols-container .ag-row[row-id='{trial}'] .ag-checkbox-input").check()
    page.locator("#runs-open-graphs").click()
    expect(page.get_by_role("tab", name="Graphs")).to_have_class(re.compile(r"\bactive\b"), timeout=SLOW)
    chosen = page.locator("#kpi-trials")
    expect(chosen).to_contain_text("lr0.1_seed0", timeout=SLOW)
    expect(chosen).to_contain_text("lr0.01_seed0")
    # and the overlay draws both trials' curves
    expect(page.locator("#kpi-graphs .legendtext").filter(has_text="lr0.01_seed0")).not_to_have_count(0, timeout=SLOW)


def _seen_rows(page) -> dict[str, dict[str, str]]:
    """What the grid shows per trial: status, steps, lr, the loss's last and best (each cell scrolled into view)."""
    seen = {}
    for trial in page.eval_on_selector_all(ROWS, "rows => rows.map(r => r.getAttribute('row-id'))"):
        cells = {}
        for column in ("status", "steps", "hp:lr", "kpi:loss/train:last", "kpi:loss/train:best"):
            cell = page.locator(CELL.format(trial=trial, column=column))
            cell.scroll_into_view_if_needed()
            cells[column] = cell.inner_text()
        seen[trial] = cells
    return seen


def _expected_rows(trials: dict) -> dict[str, dict[str, str]]:
    """The same as recorded (tests/runs/sweep_recording.py), shown to 4 significant digits."""
    from tests.runs.sweep_recording import CRASHED

    def shown(value: float) -> str:
        return f"{float(f'{value:.4g}'):g}"

    expected = {trial: {"status": "finished", "steps": str(len(losses)), "hp:lr": shown(values["lr"]),
                        "kpi:loss/train:last": shown(losses[-1]), "kpi:loss/train:best": shown(min(losses))}
                for trial, (values, losses) in trials.items()}
    expected[CRASHED] = {"status": "crashed", "steps": "2", "hp:lr": "1", "kpi:loss/train:last": "3",
                         "kpi:loss/train:best": "2"}
    return expected


def _open_runs(browser, url: str, sweep: Path) -> tuple[ComgraPage, list[str]]:
    """The app's page with the Runs tab clicked once the tabs show; the outputs of every callback asked for after
    the click (Dash's request bodies)."""
    import json

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    app = ComgraPage(context.new_page(), sweep)
    app.page.set_default_timeout(SLOW)
    app.load(url, ready="#tabs")
    outputs: list[str] = []

    def asked(request) -> None:
        if "/_dash-update-component" in request.url:
            outputs.append(json.loads(request.post_data or "{}").get("output", ""))

    app.page.on("request", asked)
    app.page.get_by_role("tab", name="Runs").click()
    expect(app.page.locator(ROWS)).to_have_count(4, timeout=SLOW)
    return app, outputs


def test_the_rows_come_with_the_tab_and_a_fresh_app_shows_those_kept_only_while_current(browser, serve, sweep,
                                                                                      tmp_path) -> None:
    import shutil

    from comgra.service import runs_summary
    from tests.runs.sweep_recording import GROUP, TRIALS, record_trial

    group = tmp_path / GROUP
    shutil.copytree(sweep, group)
    runs_summary.path_of(group).unlink(missing_ok=True)
    app, outputs = _open_runs(browser, serve(group, warm_up=False), group)
    try:
        assert _seen_rows(app.page) == _expected_rows(TRIALS)
        # the rows came in the answer that built the panel: no second request asked for them
        assert any("panel-runs.children" in o for o in outputs), outputs
        assert not any("runs-grid.rowData" in o for o in outputs), outputs
        expect(app.page.locator("#runs-count")).to_have_text("4 trials")
        assert not app.errors
    finally:
        app.page.context.close()
    assert set(runs_summary.read(group)) == set(_expected_rows(TRIALS))  # kept for the next app
    # A new run takes an id; the kept rows are now out of date for that trial only.
    rerun = {"lr": 0.3, "model": {"width": 8}, "seed": 0, "optimizer": "adam"}, [5.0, 4.0, 6.0]
    record_trial(group.parent, "lr0.1_seed0", *rerun)
    app, _ = _open_runs(browser, serve(group, warm_up=False), group)
    try:
        assert _seen_rows(app.page) == _expected_rows({**TRIALS, "lr0.1_seed0": rerun})
        assert not app.errors
    finally:
        app.page.context.close()


def test_runs_clicked_before_the_first_page_drew_loads_no_plotly_until_tensors_is_shown(browser, serve, sweep) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    app = ComgraPage(context.new_page(), sweep)
    page = app.page
    page.set_default_timeout(SLOW)
    scripts: list[str] = []
    page.on("request", lambda request: scripts.append(request.url) if "plotly" in request.url else None)
    held = []  # the first page's selection, answered only once Runs is clicked (as on a loaded machine)

    def hold(route) -> None:
        if "selection.data" in (route.request.post_data or ""):
            held.append(route)
        else:
            route.continue_()

    page.route("**/_dash-update-component*", hold)
    try:
        app.load(serve(sweep, warm_up=False), ready="#tabs")
        page.get_by_role("tab", name="Runs").click()
        expect(page.locator(ROWS)).to_have_count(4)
        assert held, "the first page's selection was not asked for"
        for route in held:
            route.continue_()
        page.unroute("**/_dash-update-component*", hold)
        # The Tensors tab's plots were asked for while hidden: no graph, no plotly.js.
        expect(page.locator("#series-plot .plot-later")).to_have_count(1)
        expect(page.locator("#histogram-plot .plot-later")).to_have_count(1)
        page.fill("#runs-filter", "lr=0\\.1$")
        expect(page.locator("#runs-count")).to_have_text("2 of 4 trials")
        assert not scripts and page.evaluate("typeof window.Plotly") == "undefined"
        page.get_by_role("tab", name="Tensors").click()
        expect(page.locator("#series-plot .js-plotly-plot")).to_have_count(1)
        expect(page.locator("#histogram-plot .js-plotly-plot")).to_have_count(1)
        expect(page.locator("#series-plot .gtitle")).to_contain_text("mean of")
        assert any("plotly" in url for url in scripts)
        # Away and back: what was drawn stays (the same element, not drawn again).
        page.evaluate("document.querySelector('#series-plot .js-plotly-plot').dataset.kept = 'yes'")
        page.get_by_role("tab", name="Runs").click()
        page.get_by_role("tab", name="Tensors").click()
        page.wait_for_timeout(500)
        assert page.evaluate("document.querySelector('#series-plot .js-plotly-plot').dataset.kept") == "yes"
        assert not app.errors
    finally:
        context.close()
