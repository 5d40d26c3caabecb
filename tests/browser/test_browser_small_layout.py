"""Issue 25's smaller layout items in Chromium, over the synthetic recording: the Samples table's header and
columns, the header row (tabs and Trial selector) at 1280 and 1024 px, the iteration marks."""
from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from comgra.server.ids import TABS

BUGGED = "trial_bugged_original_version"
FIXED = "trial_no_activation_function_on_output_layer"
SLOW = 20_000  # ms
SIZES = [(1280, 800), (1024, 700)]


@pytest.fixture
def sized_page(browser: Any, serve: Any, recording: Any) -> Any:
    from comgra_page import ComgraPage

    contexts = []

    def open_(width: int, height: int, query: str = "", **options: Any) -> Any:
        context = browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        app = ComgraPage(context.new_page(), recording)
        app.load(serve(recording, **options) + query)
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


HEADER = """() => {
  const box = e => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
                                                                  bottom: r.bottom, cy: (r.top + r.bottom) / 2}; };
  const nav = document.querySelector('#tabs');
  return {brand: box(document.querySelector('.brand')), trial: box(document.querySelector('.selector-trial')),
          nav: box(nav), navFits: nav.scrollWidth <= nav.clientWidth, width: innerWidth,
          tabs: Array.from(nav.querySelectorAll('.nav-link')).map(a => ({label: a.textContent, ...box(a),
                                                                         clipped: a.scrollWidth > a.clientWidth}))};
}"""

MARKS = """() => Array.from(document.querySelectorAll('.dash-slider-root')).filter(r => r.offsetWidth > 0).map(root =>
  Array.from(root.querySelectorAll('.dash-slider-mark')).filter(m => getComputedStyle(m).visibility !== 'hidden')
    .map(m => { const r = m.getBoundingClientRect(); return {text: m.textContent, left: r.left, right: r.right}; }))"""


@pytest.mark.parametrize("width, height", SIZES)
def test_the_header_keeps_trial_beside_the_title_and_every_tab_label_whole(sized_page: Any, width: int,
                                                                          height: int) -> None:
    from comgra.cli.app import bundled_visualization

    app = sized_page(width, height, visualization_file=bundled_visualization())  # every tab
    for tab in ("Tensors", "Samples", "Profile", "Visualization"):
        app.page.get_by_role("tab", name=tab).click()
        expect(app.page.get_by_role("tab", name=tab)).to_have_class(re.compile(r"\bactive\b"))
        header = app.page.evaluate(HEADER)
        assert len(header["tabs"]) == len(TABS) and header["tabs"][-1]["label"] == "Visualization"
        # The Trial selector on the title's row, not a row of its own; the tabs below them.
        assert header["trial"]["top"] < header["brand"]["bottom"] and header["brand"]["top"] < header["trial"]["bottom"]
        assert header["trial"]["bottom"] <= header["nav"]["top"] + 1 and header["trial"]["right"] <= width
        # Every tab's label in the window and whole.
        assert header["navFits"], header
        for link in header["tabs"]:
            assert 0 <= link["left"] and link["right"] <= width and not link["clipped"], link
    assert not app.errors


@pytest.mark.parametrize("width, height", SIZES + [(900, 700)])
def test_slider_marks_never_overlap(sized_page: Any, width: int, height: int) -> None:
    app = sized_page(width, height)
    app.page.wait_for_function(MARKS.replace("() =>", "() => (") + ").length >= 2")
    app.page.wait_for_timeout(200)  # the marks are thinned in the frame after they are drawn
    sliders = app.page.evaluate(MARKS)
    assert len(sliders) >= 2  # the training step and the iteration
    for marks in sliders:
        assert len(marks) >= 2, marks
        assert all(a["right"] <= b["left"] for a, b in zip(marks, marks[1:])), marks
    app.page.set_viewport_size({"width": 1400, "height": height})  # wider: more marks come back
    app.page.wait_for_timeout(300)
    wider = app.page.evaluate(MARKS)
    assert sum(map(len, wider)) >= sum(map(len, sliders))
    assert all(a["right"] <= b["left"] for marks in wider for a, b in zip(marks, marks[1:]))
    assert not app.errors
