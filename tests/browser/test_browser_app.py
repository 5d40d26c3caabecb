"""The app in Chromium: every click and selector shows the store's numbers for the selection."""
from __future__ import annotations

import json
import os

import itertools

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from comgra_page import has_class
from playwright.sync_api import expect

from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store import layout

BUGGED = "trial_bugged_original_version"
FIXED = "trial_no_activation_function_on_output_layer"


@pytest.fixture
def app(serve, open_page, recording):
    return open_page(serve(recording), recording)


def steps_of(recording, trial, type_=None) -> list[int]:
    table = GroupReader(recording).trial(trial).steps()
    if type_:
        table = table.filter(pc.equal(table["type_of_execution"], type_))
    return sorted(set(table.column("training_step").to_pylist()))


def graph_at(recording, trial, step, iteration) -> dict:
    reader = GroupReader(recording).trial(trial)
    (row,) = [r for r in reader.steps().to_pylist() if r["training_step"] == step and r["iteration"] == iteration]
    return reader.graph(row["graph"])


def test_the_first_page_shows_the_stores_values_and_a_findable_graph(app, recording):
    shown = app.check_against_store()
    assert (shown["trial"], shown["node_id"], shown["aggregation"]) == (BUGGED, "input", "mean")
    assert int(shown["training_step"]) == steps_of(recording, BUGGED)[0]
    node = app.page.get_by_role("button", name="subnet_mem__out, intermediate")
    expect(node).to_have_count(1)
    expect(app.page.locator("#dependency-graph canvas")).to_have_count(0)


def test_clicking_nodes_selects_them_and_draws_only_their_links(app):
    for node_id in ["subnet_mem__out", "subnet_pre", "helper_partial_sums", "output", "initial_hidden_state", "input"]:
        app.click_node(node_id)
        shown = app.check_against_store()
        assert shown["node_id"] == node_id
        edges = app.page.locator("[data-edge]").evaluate_all("els => els.map(e => e.dataset.edge)")
        assert edges and all(node_id in edge.split("->") for edge in edges), edges
    expect(app.page.locator('[data-node="subnet_pre__out"]')).to_have_class(has_class("dependent"))


def test_a_click_in_the_tensors_tab_asks_nothing_for_the_hidden_tabs(app):
    """The Samples and Compare tabs are hidden: a node click sends their callbacks no request (each held one
    of the browser's six connections to the app while the click's values were asked for); opened, the
    Samples tab still follows the selection."""
    outputs: list[str] = []
    app.page.on("request", lambda r: outputs.append((r.post_data_json or {}).get("output", ""))
                if r.url.endswith("_dash-update-component") or "_dash-update-component?" in r.url else None)
    for node_id in ["subnet_mem__out", "output"]:
        app.click_node(node_id)
    app.page.wait_for_timeout(500)
    assert any("series-plot" in o for o in outputs), outputs  # the requests are seen
    assert not [o for o in outputs if "samples-" in o or "compare-" in o], outputs
    app.page.get_by_role("tab", name="Samples").click()
    expect(app.page.locator("#samples-caption")).to_contain_text("recorded samples")


def test_every_selector_changes_the_values_to_the_stores(app, recording):
    app.click_node("subnet_mem__out")
    app.page.get_by_role("option", name="gradients").click()
    app.wait_for(kind="gradients")
    app.check_against_store()
    app.choose("aggregation-select", "STD over the batch")
    app.wait_for(aggregation="STD over the batch")
    app.check_against_store()
    app.choose("aggregation-select", "Sample 2")
    app.wait_for(aggregation="Sample 2")
    app.check_against_store()

    steps = steps_of(recording, BUGGED, "05_iterations")
    app.choose("type-select", "05_iterations")
    app.wait_for(training_step=steps[0], type_of_execution="05_iterations")
    app.check_against_store()
    app.page.click("#step-next")
    app.wait_for(training_step=steps[1])
    app.check_against_store()
    app.page.click("#step-prev")
    app.wait_for(training_step=steps[0])
    app.page.focus("#step-slider [role=slider]")
    app.page.keyboard.press("End")
    app.wait_for(training_step=steps[-1])
    app.check_against_store()
    app.page.fill("#step-input", str(steps[1] + 1))
    app.page.press("#step-input", "Enter")
    app.wait_for(training_step=steps[1])  # the nearest recorded step of that type
    expect(app.page.locator("#notice-step")).to_contain_text("nearest")  # beside the step selector

    app.page.focus("#iteration-slider [role=slider]")
    app.page.keyboard.press("ArrowRight")
    app.page.keyboard.press("ArrowRight")
    app.wait_for(iteration=2)
    app.check_against_store()
    expect(app.page.locator("#notice-step")).to_be_empty()  # a notice goes when the user acts

    app.click_node("helper_partial_sums")
    app.page.get_by_role("option", name="forward").click()
    app.choose("role-select", "running_max")
    app.wait_for(role="running_max", kind="forward")
    app.check_against_store()

    app.choose("trial-select", FIXED)
    app.wait_for(trial=FIXED)
    app.choose("aggregation-select", "Sample 1 (negative)")
    app.wait_for(aggregation="Sample 1 (negative)")
    shown = app.check_against_store()
    assert shown["role"] == "running_max"  # the role chosen for this node is remembered


def test_parameters_have_no_batch_dimension_and_a_frozen_one_no_gradient(app):
    app.choose("aggregation-select", "Sample 3")
    app.click_node("subnet_pre")
    app.wait_for(node="subnet_pre", aggregation="No batch dimension")
    expect(app.page.locator("#notice-aggregation")).to_contain_text("no batch dimension")
    app.check_against_store()
    app.page.get_by_role("option", name="gradients").click()
    app.wait_for(kind="gradients")
    app.choose("role-select", "bias1")
    app.wait_for(role="bias1", kind="forward")
    expect(app.page.locator("#notice-kind")).to_contain_text("frozen parameter")
    app.check_against_store()
    app.click_node("input")
    app.wait_for(node="input", aggregation="Sample 3")  # the wish comes back where it applies
    app.check_against_store()


def _box(app, node_id: str) -> dict:
    """Where the node sits in the graph's layout: unlike the screen, that does not move when the view scrolls to
    keep the selection in sight or when the page above the graph grows."""
    return app.page.locator(f'#dependency-graph [data-node="{node_id}"]').evaluate(
        "e => ({x: e.offsetLeft, y: e.offsetTop})")


def _selected(app) -> str:
    selected = app.page.locator("#dependency-graph .graph-node.selected")
    expect(selected).to_have_count(1)
    return selected.get_attribute("data-node")


def test_buttons_and_arrow_keys_move_along_the_graph(app, recording):
    """Moves happen in the browser: right goes to a node that depends on this one, left to one it depends
    on, up and down to the node above or below; the values then come from the store."""
    shown = app.read()
    graph = graph_at(recording, BUGGED, int(shown["training_step"]), int(shown["iteration"]))
    dependents = {e["target"] for e in graph["edges"] if e["source"] == "input"}
    here = "input"
    moves = [("button", "right"), ("button", "down"), ("key", "ArrowUp"), ("key", "ArrowLeft"),
             ("focus", "ArrowRight"), ("focus", "ArrowDown")]
    for how, move in moves:
        direction = move.removeprefix("Arrow").lower()
        before = _box(app, here)
        if how == "button":
            app.page.click(f"#nav-{direction}")
        elif how == "key":
            app.page.locator("body").click(position={"x": 5, "y": 5})
            app.page.keyboard.press(move)
        else:
            app.page.focus(f'#dependency-graph [data-node="{here}"]')
            app.page.keyboard.press(move)
        app.page.wait_for_function(f"() => !document.querySelector('#dependency-graph [data-node=\"{here}\"]')"
                                   ".classList.contains('selected')")
        there = _selected(app)
        after = _box(app, there)
        if (here, direction) == ("input", "right"):
            assert there in dependents
        if direction in ("up", "down"):
            assert after["x"] == before["x"] and (after["y"] > before["y"]) == (direction == "down")
        else:
            assert (after["x"] > before["x"]) == (direction == "right")
        app.wait_for(node=there.removesuffix("*old"))
        app.check_against_store()
        here = there
    app.page.focus('#dependency-graph [data-node="output"]')
    app.page.keyboard.press("Enter")
    app.wait_for(node="output")


def test_a_node_missing_in_an_iteration_disappears_and_the_page_says_so(app, recording):
    app.choose("type-select", "05_iterations")
    app.page.focus("#iteration-slider [role=slider]")
    app.page.keyboard.press("End")
    app.wait_for(iteration=4)
    app.click_node("loss")
    app.check_against_store()
    app.page.focus("#iteration-slider [role=slider]")
    app.page.keyboard.press("Home")
    app.wait_for(iteration=0)
    expect(app.page.locator('[data-node="loss"]')).to_have_count(0)
    expect(app.page.locator("#notice-node")).to_contain_text("Node 'loss' does not exist in iteration 0")
    app.check_against_store()
    app.page.keyboard.press("End")
    app.wait_for(iteration=4, node="loss")  # back where it exists: selected again


def test_tabs_show_network_notes_and_kpis(app, recording):
    reader = GroupReader(recording).trial(BUGGED)
    app.page.get_by_role("tab", name="Network").click()
    expect(app.page.locator("#network [data-module='main_model.subnet_pre']")).to_contain_text("parameters")
    total = sum(p["numel"] for m in reader.metadata["modules"][0]["submodules"] for p in m["parameters"])
    expect(app.page.locator("#network [data-module='main_model']")).to_have_attribute("data-total", str(total))
    expect(app.page.locator("#panel-tensors")).to_be_hidden()
    app.page.get_by_role("tab", name="Notes").click()
    expect(app.page.locator("#notes .note")).to_have_count(len(reader.notes()))
    expect(app.page.locator("#notes .note").first).to_have_text(reader.notes()[0])
    app.page.get_by_role("tab", name="Graphs").click()
    expect(app.page.locator("#kpi-graphs [data-kpi-group]")).to_have_count(2)
    expect(app.page.locator("#kpi-graphs .js-plotly-plot")).to_have_count(2)
    app.page.keyboard.press("ArrowRight")  # arrow keys do nothing outside the tensors tab
    app.page.get_by_role("tab", name="Tensors").click()
    assert app.check_against_store()["node_id"] == "input"
    expect(app.page.locator("#series-plot .js-plotly-plot")).to_have_count(1)


def test_the_visualization_tab_shows_the_users_file(serve, open_page, recording, tmp_path):
    viz = tmp_path / "viz.py"
    viz.write_text("def create_visualization(selection, data):\n"
                   "    rows = data.values(node=selection['node'], role=selection['role'], kind=selection['kind'],\n"
                   "                       iteration=selection['iteration'], aggregation=selection['aggregation'])\n"
                   "    if selection['node'] == 'output':\n        raise RuntimeError('no output plot')\n"
                   "    return f\"{selection['node']} at step {selection['training_step']}: {len(rows)} rows\"\n")
    app = open_page(serve(recording, visualization_file=viz), recording)
    app.page.get_by_role("tab", name="Visualization").click()
    step = app.read()["training_step"]
    expect(app.page.locator("#visualization")).to_have_text(f"input at step {step}: 1 rows")
    app.page.get_by_role("tab", name="Tensors").click()
    app.click_node("output")
    app.page.get_by_role("tab", name="Visualization").click()
    expect(app.page.locator("#visualization .alert-danger")).to_contain_text("RuntimeError: no output plot")


def test_new_steps_and_trials_appear_while_the_page_is_open(serve, open_page, fresh_recording, synthetic):
    app = open_page(serve(fresh_recording, poll_seconds=0.3), fresh_recording)
    trial = GroupReader(fresh_recording).trial(BUGGED)
    steps = steps_of(fresh_recording, BUGGED)
    new_step = steps[-1] + 1000
    # As a running training does: its writer holds the trial's lock while it writes, and it rewrites trial.json
    # (the app's poll lists the chunks of such trials only: comgra.service.changes).
    from comgra.store.writer import _lock_trial

    fmt.write_json_atomic(trial.directory / fmt.TRIAL_META, json.loads((trial.directory / fmt.TRIAL_META).read_text()))
    lock = _lock_trial(trial.directory, 0)
    try:
        copy_last_step(trial, new_step)
        expect(app.page.locator("#step-info")).to_contain_text(f"of {len(steps) + 1} recorded steps")
    finally:
        os.close(lock)
    # The slider is drawn again when the poll brings the new step; a key pressed while that happens can land on the
    # slider being replaced (seen under load), so the user's End is pressed again until the new step shows.
    for attempt in range(3):
        app.page.focus("#step-slider [role=slider]")
        app.page.keyboard.press("End")
        try:
            expect(app.field("training_step")).to_have_text(str(new_step), timeout=10_000)
            break
        except AssertionError:
            if attempt == 2:
                raise
    app.check_against_store()
    synthetic.write_trial(fresh_recording, "trial_written_later", 2, synthetic.Options(scale=0.01))
    app.choose("trial-select", "trial_written_later")
    app.wait_for(trial="trial_written_later")
    app.check_against_store()


def copy_last_step(trial, new_step: int) -> None:
    """Append a copy of the trial's last step under a new step number, as a running training would."""
    last = trial.steps().column("training_step")[-1].as_py()
    for table, schema in (("tensors", fmt.SCHEMAS["tensors"]), ("steps", fmt.SCHEMAS["steps"])):
        rows = trial.selection(training_step=last) if table == "tensors" else \
            trial.steps().filter(pc.equal(trial.steps()["training_step"], last))
        rows = rows.set_column(rows.schema.get_field_index("training_step"), "training_step",
                               pa.array([new_step] * rows.num_rows, pa.int64()))
        fmt.write_parquet_atomic(layout.rank_dir(trial.directory, table, 0) / fmt.chunk_name(900, new_step, new_step),
                                 layout.to_file(table, rows.cast(schema)))


def test_bad_recordings_get_banners_and_the_rest_stays_usable(serve, open_page, fresh_recording):
    fmt.write_json_atomic(fmt.trial_dir(fresh_recording, "a_empty") / fmt.TRIAL_META,
                          {"format_version": 1, "trial_id": "a_empty", "modules": []})
    fmt.write_json_atomic(fmt.trial_dir(fresh_recording, "b_future") / fmt.TRIAL_META,
                          {"format_version": fmt.FORMAT_VERSION + 1, "trial_id": "b_future"})
    chunks = sorted((layout.rank_dir(fmt.trial_dir(fresh_recording, BUGGED), "tensors", 0)).glob("*.parquet"))
    chunks[-1].write_bytes(b"garbage")
    app = open_page(serve(fresh_recording), fresh_recording, ready="#banner .alert")
    expect(app.page.locator("#banner")).to_contain_text("has no recorded steps yet")
    app.choose("trial-select", "b_future")
    expect(app.page.locator("#banner")).to_contain_text("format_version")
    app.choose("trial-select", BUGGED)
    app.wait_for(trial=BUGGED)
    app.check_against_store()
    app.page.focus("#step-slider [role=slider]")
    app.page.keyboard.press("End")
    expect(app.page.locator("#banner")).to_contain_text("damaged: not a readable Parquet file")
    expect(app.page.locator("#values")).to_contain_text("No values were recorded")
    assert "Traceback" not in app.page.content()
    app.page.keyboard.press("Home")
    app.wait_for(training_step=steps_of(fresh_recording, BUGGED)[0])
    app.check_against_store()


def test_step_buttons_draw_the_stores_values_first_and_then_move_the_selectors(app, recording):
    """A step button's values come from the values route; the button's view callback follows the answer
    (the page sends it then, once per click): slider, step box and link follow each click."""
    steps = steps_of(recording, BUGGED)
    app.click_node("subnet_mem__out")
    for position, button in [(1, "#step-next"), (2, "#step-next"), (3, "#step-next"), (2, "#step-prev")]:
        app.page.click(button)
        app.wait_for(training_step=steps[position], node="subnet_mem__out")
        app.check_against_store()
        expect(app.page.locator("#step-input")).to_have_value(str(steps[position]))
        app.page.wait_for_function(f"() => location.search.includes('step={steps[position]}')")


def test_two_browser_tabs_do_not_interfere(serve, open_page, recording):
    url = serve(recording)
    first, second = open_page(url, recording), open_page(url, recording)
    first.click_node("subnet_mem__out")
    second.click_node("output")
    second.choose("aggregation-select", "Sample 4")
    first.page.click("#step-next")
    first.wait_for(node="subnet_mem__out", aggregation="Mean over the batch")
    first.check_against_store()
    second.wait_for(node="output", aggregation="Sample 4")
    assert second.check_against_store()["training_step"] == str(steps_of(recording, BUGGED)[0])


def test_slider_marks_do_not_overlap_with_hundreds_of_steps(serve, open_page, tmp_path, synthetic):
    recording = synthetic.write_recording(tmp_path, synthetic.Options(scale=1, trials=1, steps_per_chunk=60))
    app = open_page(serve(recording), recording)
    boxes = app.page.locator("#step-slider .dash-slider-mark").evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.left, r.right]; })")
    assert 3 <= len(boxes) <= 11
    boxes.sort()
    assert all(right < next_left for (_, right), (next_left, _) in itertools.pairwise(boxes)), boxes


def test_a_series_plot_overtaken_by_a_tab_switch_is_drawn_on_return(serve, open_page, recording, monkeypatch):
    """The series plot's first answer is still on its way (a loaded machine) when the user opens another tab: Dash
    drops that answer for the tab's newer request, so coming back to the Tensors tab must draw the plot (it waited
    forever: the tab's return drew only plots marked as waiting, and a plot never drawn was not marked)."""
    import time

    from comgra.server import tensors

    real, calls = tensors.series, []

    def slow_first(*args, **kwargs):
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(4)
        return real(*args, **kwargs)

    monkeypatch.setattr(tensors, "series", slow_first)
    page = open_page(serve(recording), recording)
    assert calls, "the first series answer was asked for with the page"
    page.page.get_by_role("tab", name="Network").click()
    expect(page.page.locator("#network [data-module='main_model']")).to_be_visible()
    time.sleep(4.5)  # the first answer came back meanwhile, for a request Dash no longer waits for
    page.page.get_by_role("tab", name="Tensors").click()
    expect(page.page.locator("#series-plot .js-plotly-plot")).to_have_count(1, timeout=15_000)
