"""The distribution across steps is read and drawn only while it is in view (issue 34): a node click does not
wait for it, and scrolling to it draws the selected tensor's."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
from comgra.examples.tutorial import TRIAL_BUGGED, run_tutorial  # noqa: E402

NODE = "subnet_pre__hidden_state"


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_tutorial(tmp_path_factory.mktemp("in-view"), steps=60, min_training_steps_difference=20,
                        progress=False)


def test_the_distribution_is_drawn_when_it_comes_into_view(serve, browser, tutorial) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 600})  # short: the plot starts out of view
    try:
        _check(context.new_page(), serve(tutorial))
    finally:
        context.close()


def _check(page: Any, url: str) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_default_timeout(30_000)
    page.goto(url + f"?trial={TRIAL_BUGGED}&node={NODE}")
    page.wait_for_selector(f'#dependency-graph .graph-node.selected[data-node="{NODE}"]')
    page.wait_for_selector("#stat-mean")
    page.locator("#series-plot .js-plotly-plot").first.wait_for()  # the page's other callbacks have answered
    below = page.evaluate("() => document.getElementById('distribution-plot').getBoundingClientRect().top"
                          " > window.innerHeight")
    assert below, "the distribution plot must start out of view for this test"
    page.locator("#distribution-plot .distribution-later").wait_for()
    assert page.locator("#distribution-plot .js-plotly-plot").count() == 0
    page.locator("#distribution-plot").scroll_into_view_if_needed()
    page.locator("#distribution-plot .js-plotly-plot .main-svg").first.wait_for()
    title = page.locator("#distribution-plot .gtitle").first.text_content()
    assert NODE in title
    # Another node clicked while the plot is in view: its distribution is drawn at once.
    page.evaluate("() => window.comgraGraph.select('subnet_mem__memory')")
    page.wait_for_function("() => { const t = document.querySelector('#distribution-plot .gtitle');"
                           " return t && t.textContent.includes('subnet_mem__memory'); }")
    assert errors == []
