"""Browser tests: the real app on a real server, driven by Playwright in Debian's Chromium.

Each test gets a server in a thread on a free port, over a synthetic recording
written to its own temporary folder. Skipped where Chromium or Playwright is
missing, except in CI (the CI variable set), where they fail.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from comgra_page import TIMEOUT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):  # in CI the browser tests must run: .ci/run installs Chromium
            pytest.fail(f"no Chromium at {CHROMIUM}; install it with apt-get install -y chromium")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    sync_api.expect.set_options(timeout=TIMEOUT)  # one policy for every module (see comgra_page.TIMEOUT)
    playwright = sync_api.sync_playwright().start()
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    yield browser
    browser.close()
    playwright.stop()


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """``serve(path, **create_app options) -> url`` of a server that stops after the test. Served without a token
    (the opt-out of a single-user machine): these tests click through the app; test_browser_token.py tests the
    token's doors."""
    from comgra.server.app import create_app, make_http_server, url_of

    servers = []

    def start(path: Path, **options: Any) -> str:
        options.setdefault("poll_seconds", 60)
        server = make_http_server(create_app(path, **options), host="127.0.0.1", port=0, token=False)
        thread = threading.Thread(target=server.serve_forever, name="comgra-test-server", daemon=True)
        thread.start()
        servers.append((server, thread))
        return url_of(server)

    yield start
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def open_page(browser: Any) -> Iterator[Callable[[str, Path], Any]]:
    """``open_page(url, recording) -> ComgraPage``, once ``ready`` (by default: the values) is shown."""
    from comgra_page import ComgraPage

    contexts = []

    def open_(url: str, recording: Path, ready: str = "#stat-mean") -> ComgraPage:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        contexts.append(context)
        page = ComgraPage(context.new_page(), recording)
        page.load(url, ready)
        return page

    yield open_
    for context in contexts:
        context.close()
