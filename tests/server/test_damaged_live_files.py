"""Damaged ``live/run.json``, ``live/breakpoints.json`` and ``resources-rNNN.json`` (issue 21, item 13):
the REST API answers a clean 4xx or leaves the file out, never a 500, never blocks on a FIFO."""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from comgra.store import format as fmt

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parents[1] / "api"))
from profiled_recording import TRIAL, client_of, copy_of_group, record_without_fsync  # noqa: E402

T = f"/api/v1/trials/{TRIAL}"
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_without_fsync(tmp_path_factory.mktemp("live") / "store", steps=2)


@pytest.fixture
def group_dir(recorded: Path, tmp_path: Path) -> Path:
    return copy_of_group(recorded, tmp_path)


@pytest.fixture
def client(group_dir: Path) -> Iterator[Any]:
    yield from client_of(group_dir)


def within(seconds: float, call: Callable[[], Any]) -> Any:
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", call()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"the request was still blocked after {seconds} s")
    return box["value"]


def write(path: Path, content: str | None) -> None:
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    if content is None:
        os.mkfifo(path)
    else:
        path.write_text(content)


def _paused(**fields: Any) -> str:
    import socket

    return json.dumps({"state": "paused", "pid": os.getpid(), "hostname": socket.gethostname(), "token": "t",
                       "port": 1, **fields})


RUN_FILES = {"deeply nested": DEEP, "a list": "[1, 2]", "hits a list": _paused(hits=[1, 2]),
             "hits a number": _paused(hits=5), "hits of strings": _paused(hits={"bp1": "x"}),
             "paused without token": _paused(token=None), "port a string": _paused(port="http"),
             "not json": "{state", "a fifo": None}
BREAKPOINT_FILES = {"deeply nested": DEEP, "entries are numbers": '{"breakpoints": [1, 2]}',
                    "entry without id": '{"breakpoints": [{"target": "x"}]}',
                    "id a number": '{"breakpoints": [{"id": 5, "target": "x", "condition": "mean > 1"}]}',
                    "a fifo": None}
RESOURCE_FILES = {"deeply nested": DEEP, "gpu_status a number": '{"gpu_status": 5}', "a fifo": None}


def no_500_and_nothing_logged(response: Any, caplog: pytest.LogCaptureFixture) -> None:
    assert response.status_code < 500, response.get_json()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


@pytest.mark.parametrize("case", RUN_FILES)
def test_a_damaged_run_file(client: Any, group_dir: Path, caplog: pytest.LogCaptureFixture, case: str) -> None:
    write(fmt.trial_dir(group_dir, TRIAL) / "live" / "run.json", RUN_FILES[case])
    response = within(10, lambda: client.get(f"{T}/run"))
    no_500_and_nothing_logged(response, caplog)
    assert response.get_json()["state"] in ("unknown", "paused", "running", "finished")
    assert isinstance(response.get_json().get("hits", {}), dict)
    command = within(10, lambda: client.post(f"{T}/run/continue"))
    no_500_and_nothing_logged(command, caplog)
    assert command.status_code == 409
    listed = within(10, lambda: client.get(f"{T}/breakpoints"))
    no_500_and_nothing_logged(listed, caplog)


@pytest.mark.parametrize("case", BREAKPOINT_FILES)
def test_a_damaged_breakpoints_file(client: Any, group_dir: Path, caplog: pytest.LogCaptureFixture,
                                    case: str) -> None:
    write(fmt.trial_dir(group_dir, TRIAL) / "live" / "breakpoints.json", BREAKPOINT_FILES[case])
    for call in (lambda: client.get(f"{T}/breakpoints"),
                 lambda: client.patch(f"{T}/breakpoints/bp1", json={"enabled": False}),
                 lambda: client.delete(f"{T}/breakpoints/bp1"),
                 lambda: client.post(f"{T}/breakpoints", json={"target": "input", "condition": "mean > 1"})):
        response = within(10, call)
        no_500_and_nothing_logged(response, caplog)
        if response.status_code >= 400:
            assert "breakpoints.json" in response.get_json()["error"]["message"]


@pytest.mark.parametrize("case", RESOURCE_FILES)
def test_a_damaged_resource_status_file(client: Any, group_dir: Path, caplog: pytest.LogCaptureFixture,
                                        case: str) -> None:
    path = fmt.trial_dir(group_dir, TRIAL) / "resources-r000.json"
    write(path, RESOURCE_FILES[case])
    response = within(10, lambda: client.get(f"{T}/resources"))
    no_500_and_nothing_logged(response, caplog)
    assert response.status_code == 200 and isinstance(response.get_json()["gpu"], str)
