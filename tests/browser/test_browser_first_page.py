"""The first page holds the Tensors tab alone (issue 34 item 2): at load no callback of another tab's components
fires and none of them is on the page; each tab's panel is built when it is first opened, and works then."""
from __future__ import annotations

import json
from typing import Any

from playwright.sync_api import expect

from comgra.server import layout


def _ids(component: Any) -> set[str]:
    return {c.id for c in component._traverse() if isinstance(getattr(c, "id", None), str)}


def test_the_first_page_fires_no_hidden_tabs_callbacks_and_builds_each_tab_when_opened(
        serve: Any, open_page: Any, recording: Any) -> None:
    first = _ids(layout.page(title="", data_version="", poll_ms=1000, with_visualization=False))
    later = _ids(layout.full_page(with_visualization=False)) - first  # the other tabs' components
    assert {"runs-grid", "findings-list", "bp-table", "kpi-graphs", "health-gradients"} <= later
    url = serve(recording)
    fired: list[str] = []
    app = open_page(url, recording, ready="#tabs")

    def on_request(request: Any) -> None:
        if "_dash-update-component" in request.url:
            fired.append(json.loads(request.post_data or "{}").get("output", ""))

    app.page.on("request", on_request)
    app.page.reload()
    expect(app.page.locator("#stat-mean")).to_be_visible()
    expect(app.page.locator("#series-plot .js-plotly-plot")).to_be_attached()
    named = {part.split("@")[0].rsplit(".", 1)[0] for output in fired for part in output.strip(".").split("...")}
    assert fired and not named & later, sorted(named & later)
    for component in ("runs-grid", "findings-list", "bp-table", "kpi-graphs"):
        expect(app.page.locator(f"#{component}")).to_have_count(0)

    app.page.get_by_role("tab", name="Findings").click()
    expect(app.page.locator("#findings-count")).to_contain_text("finding")
    app.page.get_by_role("tab", name="Runs").click()  # built with Graphs and Compare, which its buttons open
    expect(app.page.locator("#runs-grid .ag-row").first).to_be_visible()
    expect(app.page.locator("#kpi-graphs")).to_be_attached()
    expect(app.page.locator("#compare-trial")).to_be_attached()
    app.page.get_by_role("tab", name="Graphs").click()
    expect(app.page.locator("#kpi-graphs .js-plotly-plot").first).to_be_visible()
    app.page.get_by_role("tab", name="Findings").click()  # built once: its filters keep their state
    expect(app.page.locator("#findings-count")).to_contain_text("finding")
    assert not app.errors
