"""A real training process, paused and resumed over HTTP: the REST API's breakpoints and run control.

The test sets a breakpoint through POST /breakpoints on a run in progress, sees it paused through
GET /run, reads the paused step's values through GET /values, continues it through POST
/run/continue, and checks that training finished with the same losses as a run without it.
"""
from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "breakpoints"))
from live_processes import start_training, stop_all, wait_until  # noqa: E402  (the live tests' launcher)

PAUSE_AT = 5
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_process_left_waiting() -> Iterator[None]:
    yield
    stop_all()  # a failed test must not leave a training process paused forever


_TOKEN: dict[str, str] = {}  # the served app's Authorization header (state changes need it on loopback too)


def _call(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **_TOKEN})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _serve(group: Path) -> tuple[str, Callable[[], None]]:
    from comgra.server.app import create_app, make_http_server, url_of

    app = create_app(group, warm_up=False, poll_seconds=60)
    server = make_http_server(app, host="127.0.0.1", port=0)
    _TOKEN["Authorization"] = f"Bearer {app.server.config['COMGRA_API_TOKEN']}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return url_of(server).rstrip("/") + "/api/v1/trials/trial", stop


def test_a_breakpoint_set_over_http_pauses_and_resumes_training(tmp_path: Path) -> None:
    plain, _, plain_out = start_training(tmp_path / "plain")
    (plain_out / "go").touch()
    process, _, out = start_training(tmp_path / "paused")
    group = out.parent / "root" / "group"
    wait_until(lambda: (group / "trials" / "trial" / "trial.json").is_file(), process, "the trial's metadata")
    api, stop = _serve(group)
    try:
        status, created = _call(f"{api}/breakpoints", "POST", {"target": "loss", "condition": f"step == {PAUSE_AT}"})
        assert status == 201 and created["hits"] == 0, created
        status, error = _call(f"{api}/breakpoints", "POST", {"target": "loss", "condition": "__import__('os')"})
        assert status == 400 and error["error"]["field"] == "condition"
        (out / "go").touch()

        state = wait_until(lambda: (s := _call(f"{api}/run")[1])["state"] == "paused" and s, process, "the pause")
        assert state["training_step"] == PAUSE_AT
        assert not (out / "losses-r000.json").exists()  # really waiting
        status, listed = _call(f"{api}/breakpoints")
        assert listed["breakpoints"][0]["hits"] == 1

        status, values = _call(f"{api}/values?step={PAUSE_AT}&node=loss")
        assert status == 200, values
        paused_loss = values["values"]["mean"]

        status, sent = _call(f"{api}/run/continue", "POST", {})
        assert status == 200 and sent["sent"] == "continue"
        assert process.wait(90) == 0, process.communicate()[1][-2000:]
        status, final = _call(f"{api}/run")
        assert final["state"] == "finished"
        status, refused = _call(f"{api}/run/continue", "POST", {})
        assert status == 409
    finally:
        stop()
    assert plain.wait(90) == 0
    losses = json.loads((out / "losses-r000.json").read_text())
    assert losses == json.loads((plain_out / "losses-r000.json").read_text())
    assert paused_loss == pytest.approx(losses[PAUSE_AT], rel=1e-6)
