"""Issue 25's smaller items in Chromium: an unknown tab in a link, the Resources axes, the flame graph,
the Samples columns and the header at 1024 px."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from comgra.store import layout
from playwright.sync_api import expect

sys.path.insert(0, str(Path(__file__).parents[1] / "api"))
from profiled_recording import TRIAL, record  # noqa: E402

SLOW = 20_000  # ms: on a busy machine a tab's first answer can wait behind the Tensors tab's callbacks


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    return record(tmp_path_factory.mktemp("browser-small") / "store", steps=4, resource_seconds=0.05)


def in_viewport(page: Any, selector: str) -> bool:
    return page.evaluate("""(s) => { const r = document.querySelector(s).getBoundingClientRect();
        return r.width > 0 && r.left >= 0 && r.top >= 0 && r.right <= innerWidth && r.bottom <= innerHeight; }""",
                         selector)


def test_an_unknown_tab_in_the_link_opens_the_default_tab_with_a_message(serve: Any, open_page: Any,
                                                                          recording: Path) -> None:
    app = open_page(serve(recording) + "?tab=foo", recording)
    expect(app.page.locator("#panel-tensors")).to_be_visible(timeout=SLOW)
    notice = app.page.locator("#tab-notice")
    expect(notice).to_contain_text("There is no tab 'foo'", timeout=SLOW)
    assert in_viewport(app.page, "#tab-notice")
    expect(app.page.get_by_role("tab", name="Tensors")).to_have_class(re.compile(r"\bactive\b"))
    assert "tab=tensors" in app.page.url
    app.page.get_by_role("tab", name="Notes").click()  # another tab: the notice goes
    expect(notice).to_have_text("", timeout=SLOW)
    # A known tab opens it, with no notice.
    app.page.goto(serve(recording) + "?tab=notes")
    expect(app.page.locator("#panel-notes")).to_be_visible(timeout=SLOW)
    expect(app.page.locator("#tab-notice")).to_have_text("")


TICKS = """(plot) => Array.from(document.querySelectorAll(plot + ' .%s text')).map(t => {
    const r = t.getBoundingClientRect(), svg = document.querySelector(plot + ' .main-svg').getBoundingClientRect();
    return {text: t.textContent, inside: r.left >= svg.left - 1 && r.right <= svg.right + 1 && r.top >= svg.top - 1
            && r.bottom <= svg.bottom + 1}; })"""


@pytest.mark.parametrize("width, height", [(1280, 800), (1024, 700)])
def test_resources_reads_bytes_in_binary_units_and_its_axes_fit(browser: Any, serve: Any, recording: Path,
                                                                width: int, height: int) -> None:
    from comgra_page import ComgraPage
    import pyarrow.dataset as ds

    context = browser.new_context(viewport={"width": width, "height": height})
    try:
        app = ComgraPage(context.new_page(), recording)
        app.load(serve(recording) + "?tab=resources", ".resource-plot .js-plotly-plot")
        plot = '.resource-plot[data-kind="bytes"]'
        expect(app.page.locator(plot + " .ytick text").first).to_be_visible(timeout=SLOW)
        rows = ds.dataset(str(layout.trial_partition(recording, "resources", TRIAL)), format="parquet", partitioning="hive").to_table().to_pylist()
        largest = max(r["value"] for r in rows if r["metric"].endswith("bytes") and "total" not in r["metric"])
        unit = next(u for p, u in enumerate(["B", "KiB", "MiB", "GiB", "TiB"]) if largest < 1024 ** (p + 1))
        yticks = app.page.evaluate(TICKS % "ytick", plot)
        assert yticks and all(re.fullmatch(rf"[\d.,]+ {unit}", t["text"]) for t in yticks), yticks
        title = app.page.locator(plot + " .gtitle").text_content()
        assert title == f"Memory ({unit})"
        for kind in ("bytes", "percent"):  # the time axis: one line of clock times, inside the figure
            xticks = app.page.evaluate(TICKS % "xtick", f'.resource-plot[data-kind="{kind}"]')
            assert xticks and all(re.fullmatch(r"\d\d:\d\d:\d\d(\.\d+)?", t["text"]) and t["inside"] for t in xticks), \
                [t for t in xticks if not t["inside"] or not re.fullmatch(r"\d\d:\d\d:\d\d(\.\d+)?", t["text"])]
            assert len({t["text"] for t in xticks}) == len(xticks), xticks  # each tick its own time
            assert all(t["inside"] for t in app.page.evaluate(TICKS % "ytick", f'.resource-plot[data-kind="{kind}"]'))
        # The percent plot names a GPU only where one was sampled.
        percent_title = app.page.locator('.resource-plot[data-kind="percent"] .gtitle').text_content()
        assert ("GPU" in percent_title) == any(str(r["source"]).startswith("gpu") for r in rows), percent_title
        assert not app.errors
    finally:
        context.close()


FLAME = """() => { const gd = document.querySelector('#profile-flame .js-plotly-plot');
  return Array.from(gd.querySelectorAll('g.slice')).map(g => ({
    id: g.__data__.data.data.id, fill: getComputedStyle(g.querySelector('path.surface')).fill,
    text: (g.querySelector('text') || {textContent: ''}).textContent})); }"""


def test_the_flame_graph_colours_by_module_in_both_phases_and_fills_its_root(serve: Any, open_page: Any,
                                                                             recording: Path) -> None:
    app = open_page(serve(recording) + "?tab=profile", recording, ready="#profile-flame .js-plotly-plot")
    expect(app.page.locator("#profile-flame g.slice").first).to_be_visible(timeout=SLOW)
    forward = {s["id"]: s for s in app.page.evaluate(FLAME)}
    root = forward["net"]
    assert root["text"].startswith("net") and root["fill"] not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)"), root
    app.page.get_by_label("backward").check()
    expect(app.page.locator("#profile-flame .gtitle")).to_have_text("backward time by module (s)", timeout=SLOW)
    backward = {s["id"]: s for s in app.page.evaluate(FLAME)}
    assert set(backward) == set(forward) and len(forward) > 3
    assert {m: s["fill"] for m, s in backward.items()} == {m: s["fill"] for m, s in forward.items()}
    assert len({s["fill"] for s in forward.values()}) > 1  # coloured by name, not one colour for all
    assert not app.errors


def test_the_trace_download_takes_a_step_range(serve: Any, open_page: Any, recording: Path) -> None:
    import json

    import pyarrow.dataset as ds

    app = open_page(serve(recording) + "?tab=profile", recording, ready="#profile-flame .js-plotly-plot")
    steps = sorted({r["training_step"] for r in ds.dataset(str(layout.trial_partition(recording, "layers", TRIAL)),
                                                             format="parquet", partitioning="hive").to_table().to_pylist()})
    first, last = steps[1], steps[-2]
    app.page.fill("#profile-first-step", str(first))
    app.page.fill("#profile-last-step", str(last))
    app.page.keyboard.press("Enter")
    link = app.page.locator("a.trace-download")
    expect(link).to_have_attribute("href", re.compile(rf"first_step={first}&last_step={last}"), timeout=SLOW)
    assert in_viewport(app.page, "#profile-first-step") and in_viewport(app.page, "a.trace-download")
    with app.page.expect_download() as info:
        link.click()
    trace = json.loads(Path(info.value.path()).read_text())
    shown = {e["args"]["training_step"] for e in trace["traceEvents"] if "training_step" in e.get("args", {})}
    assert shown == {s for s in steps if first <= s <= last} and len(steps) > len(shown)
    assert not app.errors
