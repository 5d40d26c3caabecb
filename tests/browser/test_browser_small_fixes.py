"""Issue 25's smaller items in Chromium: an unknown tab in a link, the Resources axes, the flame graph,
the Samples columns and the header at 1024 px."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
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
    # A known tab opens it, with no notice.
    app.page.goto(serve(recording) + "?tab=notes")
    expect(app.page.locator("#panel-notes")).to_be_visible(timeout=SLOW)
    expect(app.page.locator("#tab-notice")).to_have_text("")
