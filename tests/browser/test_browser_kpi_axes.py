"""The Graphs tab's figures keep one x-axis when the user zooms or pans one of them (assets/kpi_axes.js), in
Chromium at 1280x800."""
from __future__ import annotations

from comgra_page import ComgraPage
from playwright.sync_api import expect

BUGGED = "trial_bugged_original_version"
FIXED = "trial_no_activation_function_on_output_layer"
SLOW = 30_000
RANGES = "() => Array.from(document.querySelectorAll('#kpi-graphs .js-plotly-plot')).map(p => p._fullLayout.xaxis.range)"


def open_at(browser, serve, recording, width, height):
    context = browser.new_context(viewport={"width": width, "height": height})
    page = ComgraPage(context.new_page(), recording)
    page.load(serve(recording))
    return context, page


def test_zooming_one_kpi_figure_moves_the_others(browser, serve, recording):
    context, app = open_at(browser, serve, recording, 1280, 800)
    try:
        app.page.get_by_role("tab", name="Graphs").click()
        plots = app.page.locator("#kpi-graphs .js-plotly-plot")
        expect(plots).to_have_count(2, timeout=SLOW)
        expect(plots.nth(1).locator(".xtick").first).to_be_attached(timeout=SLOW)
        app.page.evaluate("() => Plotly.relayout(document.querySelectorAll('#kpi-graphs .js-plotly-plot')[1], "
                          "{'xaxis.range': [20, 60]})")
        app.page.wait_for_function("() => Array.from(document.querySelectorAll('#kpi-graphs .js-plotly-plot'))"
                                   ".every(p => p._fullLayout.xaxis.range[0] === 20 && p._fullLayout.xaxis.range[1] === 60)",
                                   timeout=SLOW)
        assert app.page.evaluate(RANGES) == [[20, 60], [20, 60]]
        assert not app.errors
    finally:
        context.close()
