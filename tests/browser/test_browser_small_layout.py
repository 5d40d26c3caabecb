"""Issue 25's smaller layout items in Chromium, over the synthetic recording: the Samples table's header and
columns, the header row (tabs and Trial selector) at 1280 and 1024 px, the iteration marks."""
from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

BUGGED = "trial_bugged_original_version"
FIXED = "trial_no_activation_function_on_output_layer"
SLOW = 20_000  # ms
SIZES = [(1280, 800), (1024, 700)]


@pytest.fixture
def sized_page(browser: Any, serve: Any, recording: Any) -> Any:
    from comgra_page import ComgraPage

    contexts = []

    def open_(width: int, height: int, query: str = "") -> Any:
        context = browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        app = ComgraPage(context.new_page(), recording)
        app.load(serve(recording) + query)
        return app

    yield open_
    for context in contexts:
        context.close()


def choose_option(page: Any, dropdown: str, label: str) -> None:
    page.click(f"#{dropdown}")
    page.locator(".dash-dropdown-option", has_text=label).first.click()
    page.keyboard.press("Escape")


HEADERS = """() => Array.from(document.querySelectorAll('#samples-table th.dash-header')).map(th => {
  const name = th.querySelector('.column-header-name'), sort = th.querySelector('.column-header--sort');
  const r = th.getBoundingClientRect(), n = name.getBoundingClientRect(), s = sort ? sort.getBoundingClientRect() : null;
  return {column: th.getAttribute('data-dash-column'), left: r.left, right: r.right, width: r.width,
          nameLeft: n.left, nameRight: n.right, sortLeft: s && s.left, sortRight: s && s.right,
          html: th.innerHTML.slice(0, 400)}; })"""


@pytest.mark.parametrize("width, height", SIZES)
def test_samples_hides_empty_columns_and_puts_the_sort_arrow_by_its_title(sized_page: Any, width: int,
                                                                        height: int) -> None:
    app = sized_page(width, height)
    app.click_node("output")
    app.page.get_by_role("tab", name="Samples").click()
    app.page.click("#samples-add-selected")  # the bugged trial: its samples have no categories
    expect(app.page.locator("#samples-table th[data-dash-column='output|output|forward|mean']")).to_have_count(
        1, timeout=SLOW)
    headers = app.page.evaluate(HEADERS)
    columns = [h["column"] for h in headers]
    assert "category" not in columns and columns[0] == "sample", columns  # no category in this trial: no column
    for header in headers:  # each arrow right after its own title, inside its own cell
        assert header["left"] <= header["nameLeft"] < header["nameRight"] <= header["sortLeft"] <= header["nameRight"] + 12
        assert header["sortRight"] <= header["right"], header
    assert app.page.evaluate("""() => Array.from(document.querySelectorAll('#samples-table .column-header-name'))
        .every(e => e.scrollWidth <= e.clientWidth)""")
    # A trial whose samples have categories shows the column.
    app.page.get_by_role("tab", name="Tensors").click()
    app.choose("trial-select", FIXED)
    app.wait_for(trial=FIXED)
    app.page.get_by_role("tab", name="Samples").click()
    expect(app.page.locator("#samples-table th[data-dash-column='category']")).to_have_count(1, timeout=SLOW)
    assert not app.errors
