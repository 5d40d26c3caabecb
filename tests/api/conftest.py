"""The REST API over a small profiled recording, served by the real app's Flask server."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def profiled_group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from comgra.store import format as fmt
    from profiled_recording import record

    durable, fmt.DURABLE_WRITES = fmt.DURABLE_WRITES, False
    try:
        return record(tmp_path_factory.mktemp("api") / "store")
    finally:
        fmt.DURABLE_WRITES = durable


@pytest.fixture
def api_app(profiled_group: Path) -> Iterator[Any]:
    """The app's Flask server (Dash and the API), not bound to any port."""
    from comgra.server.app import create_app

    app = create_app(profiled_group, warm_up=False)
    yield app.server
    app.server.config.clear()


@pytest.fixture
def client(api_app: Any) -> Any:
    return api_app.test_client()
