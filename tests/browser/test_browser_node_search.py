"""Node search across iterations (issue 33, item 9), in Chromium on the tutorial: at iteration 0 the loss does not
exist yet (it is registered at the last iteration), and searching ``loss`` still finds it and opens the iteration
that has it, with the loss selected and its values as the store holds them."""
from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest
from comgra_page import ComgraPage
from playwright.sync_api import expect

pytest.importorskip("torch")
from comgra.examples.tutorial import TRIAL_BUGGED, run_tutorial  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

SLOW = 30_000
expect.set_options(timeout=SLOW)  # a loaded 2-core machine


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_tutorial(tmp_path_factory.mktemp("search"), steps=40, min_training_steps_difference=20, hidden_size=32,
                        progress=False, trials=(TRIAL_BUGGED,))


def test_searching_a_node_of_a_later_iteration_opens_that_iteration(serve, browser, tutorial):
    trial = GroupReader(tutorial).trial(TRIAL_BUGGED)
    steps = trial.steps()
    step = steps["training_step"][0].as_py()
    rows = steps.filter(pc.equal(steps["training_step"], step))
    iterations = {r["iteration"]: {n["node"] for n in trial.graph(r["graph"])["nodes"]} for r in rows.to_pylist()}
    assert "loss" not in iterations[0]  # the case of the issue: the loss exists only at a later iteration
    with_loss = min(i for i, names in iterations.items() if "loss" in names)

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    app = ComgraPage(context.new_page(), tutorial)
    app.page.set_default_timeout(SLOW)  # a loaded 2-core machine
    try:
        search_and_open(app, serve(tutorial), step, with_loss)
    finally:
        context.close()


def search_and_open(app, url, step, with_loss):
    app.load(url + f"?trial={TRIAL_BUGGED}&step={step}&iteration=0&node=input")
    app.wait_for(iteration=str(0))
    app.page.click("#node-search")
    app.page.keyboard.type("loss")
    option = app.page.locator(".dash-dropdown-option", has_text=f"only in iteration {with_loss}")
    expect(option.first).to_be_visible(timeout=SLOW)
    expect(app.page.get_by_text("No options found")).to_have_count(0)
    app.page.locator(".dash-dropdown-option", has_text=f"loss [loss] · only in iteration {with_loss}").first.click()
    app.wait_for(node="loss", iteration=str(with_loss))
    expect(app.page.locator("#dependency-graph .graph-node.selected")).to_have_attribute("data-node", "loss", timeout=SLOW)
    app.check_against_store()
    assert not app.errors
