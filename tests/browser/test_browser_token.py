"""Off loopback, the Breakpoints tab in a real browser: refused without the token, working after the printed link.

The server is bound to 0.0.0.0, as ``comgra --path DIR --host 0.0.0.0`` does; Chromium opens it through
127.0.0.1. Without the token an action is refused with a message that says how to get it; the link
``/?token=...`` that the server prints sets the cookie (and leaves the address without the token),
after which the tab's actions work, sent by the page's own requests.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from comgra.breakpoints import control
from comgra.server import api
from comgra.server.app import create_app, make_http_server

expect = pytest.importorskip("playwright.sync_api").expect


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_the_tab_needs_the_token_and_the_printed_link_gives_it(fresh_recording: Path, browser: Any, host: str) -> None:
    """On loopback the page reads without the token but its actions need it (issue 31 item 5); off loopback
    the page itself needs it."""
    (trial,) = [p.name for p in (fresh_recording / "trials").iterdir()]
    app = create_app(fresh_recording, warm_up=False, poll_seconds=60)
    server = make_http_server(app, host=host, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    token = app.server.config[api.TOKEN_CONFIG]
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        response = page.goto(f"{base}/?tab=breakpoints&trial={trial}")
        if host == "0.0.0.0":
            assert response.status == 401 and "token" in page.content()
        else:
            expect(page.locator("#bp-run-state")).to_be_visible(timeout=20000)
            page.fill("#bp-target", "loss")
            page.fill("#bp-condition", "has_nan")
            page.click("#bp-add")
            expect(page.locator("#bp-message")).to_contain_text("token", timeout=20000)
        assert control.list_breakpoints(fresh_recording / "trials" / trial) == []

        page.goto(f"{base}/?token={token}&tab=breakpoints&trial={trial}")
        assert "token" not in page.url and "tab=breakpoints" in page.url
        expect(page.locator("#bp-run-state")).to_be_visible(timeout=20000)
        page.fill("#bp-target", "loss")
        page.fill("#bp-condition", "has_nan")
        page.click("#bp-add")
        expect(page.locator("#bp-message")).to_contain_text("Added bp1", timeout=20000)
        assert [b["target"] for b in control.list_breakpoints(fresh_recording / "trials" / trial)] == ["loss"]
    finally:
        context.close()
        server.shutdown()
        server.server_close()
        thread.join(5)
