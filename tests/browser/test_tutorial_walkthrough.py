"""The README's tutorial, walked in the browser on a recording our recorder made of the tutorial network.

Each step checks that the numbers on screen equal the store's for what the page says it shows.
"""
from __future__ import annotations

import pyarrow.compute as pc
import pytest
from playwright.sync_api import expect

from comgra.store import GroupReader

pytest.importorskip("torch")
from comgra.examples import custom_visualization  # noqa: E402
from comgra.examples.tutorial import TRIAL_BUGGED, TRIAL_FIXED, run_tutorial  # noqa: E402

CHAIN = ["input", "subnet_pre__hidden_state", "subnet_out__out", "output", "loss_per_sample", "loss"]


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory):
    # Warnings are errors: the tutorial records without any.
    return run_tutorial(tmp_path_factory.mktemp("tutorial"), steps=80, min_training_steps_difference=20,
                        hidden_size=16, progress=False)


def _longest_type(group) -> tuple[str, int]:
    """The recorded type of step with the most iterations, and its last iteration."""
    steps = GroupReader(group).trial(TRIAL_BUGGED).steps()
    last = pc.max(steps["iteration"]).as_py()
    row = steps.filter(pc.equal(steps["iteration"], last)).to_pylist()[0]
    return row["type_of_execution"], last


def test_walk_from_input_to_loss_on_the_last_iteration(serve, open_page, tutorial):
    app = open_page(serve(tutorial), tutorial)
    type_of_execution, last = _longest_type(tutorial)
    app.choose("type-select", type_of_execution)
    app.wait_for(type_of_execution=type_of_execution)
    app.page.focus("#iteration-slider [role=slider]")
    app.page.keyboard.press("End")
    app.wait_for(iteration=last)
    app.click_node("input")
    app.choose("aggregation-select", "Sample 0")
    app.wait_for(aggregation="Sample 0")
    assert app.check_against_store()["node_id"] == "input"
    for node_id in CHAIN[1:]:
        app.click_node(node_id)
        shown = app.check_against_store()
        assert shown["node_id"] == node_id
    assert shown["aggregation"] == "none"  # the loss has no batch dimension: the page falls back and says so

    app.click_node("subnet_out__out")
    app.page.get_by_role("option", name="gradients").click()
    app.wait_for(kind="gradients")
    app.check_against_store()
    app.choose("trial-select", TRIAL_FIXED)
    app.wait_for(trial=TRIAL_FIXED)
    app.check_against_store()


def test_helper_partial_sums_roles_and_the_shipped_visualization(serve, open_page, tutorial):
    app = open_page(serve(tutorial, visualization_file=custom_visualization.__file__), tutorial)
    app.click_node("helper_partial_sums")
    current = app.read()["role"]
    for role in [r for r in ("final_sums", "remaining_sums", "partial_sums") if r != current]:
        app.choose("role-select", role)
        app.wait_for(role=role)
        app.check_against_store()
    app.page.get_by_role("tab", name="Visualization").click()
    expect(app.page.locator("#visualization .js-plotly-plot")).to_have_count(1)
    expect(app.page.locator("#visualization .alert-danger")).to_have_count(0)


def test_network_notes_and_graphs_tabs_show_the_trial(serve, open_page, tutorial):
    app = open_page(serve(tutorial), tutorial)
    reader = GroupReader(tutorial).trial(TRIAL_BUGGED)
    app.page.get_by_role("tab", name="Network").click()
    total = reader.metadata["modules"][0]["num_parameters"]
    expect(app.page.locator("#network [data-module='main_model']")).to_have_attribute("data-total", str(total))
    app.page.get_by_role("tab", name="Notes").click()
    expect(app.page.locator("#notes .note")).to_have_count(len(reader.notes()))
    app.page.get_by_role("tab", name="Graphs").click()
    groups = set(reader.kpis()["kpi_group"].to_pylist())
    expect(app.page.locator("#kpi-graphs [data-kpi-group]")).to_have_count(len(groups))
