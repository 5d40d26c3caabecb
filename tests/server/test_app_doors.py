"""The app's state-changing doors, through the real server: crafted ``/_dash-update-component`` posts.

The Breakpoints tab's callbacks take the trial from the browser. A crafted request must not make the
app read or write anything outside the recording, nor connect anywhere (items 1 and 7 of issue 21),
and, when the server is reachable from other machines, its actions need the same token as the REST
API's state-changing calls (item 2): sent as ``Authorization: Bearer`` or as the cookie that the link
the server prints (``/?token=...``) sets.
"""
from __future__ import annotations

import http.cookiejar
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from comgra.breakpoints import control
from comgra.server import api, doors
from comgra.server.app import create_app, make_http_server

UPDATE = "/_dash-update-component"
ACT_OUTPUTS = ["bp-table.children", "bp-run-state.children", "bp-shown.data", "bp-message.children"]


# -- the server and the requests -------------------------------------------------------------------------
_SENT_TOKEN: dict[str, str] = {}  # while served(send_token=True): the Authorization header every request sends


@contextmanager
def served(group: Path, host: str = "127.0.0.1", send_token: bool = True) -> Iterator[tuple[str, Any]]:
    """The app on ``host``; with ``send_token`` every ``request`` carries its token, as the printed link gives it."""
    app = create_app(group, warm_up=False, poll_seconds=60)
    server = make_http_server(app, host=host, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    if send_token:
        _SENT_TOKEN["Authorization"] = f"Bearer {app.server.config[api.TOKEN_CONFIG]}"
    try:
        yield f"http://127.0.0.1:{server.server_port}", app
    finally:
        _SENT_TOKEN.clear()
        server.shutdown()
        server.server_close()
        thread.join(5)


def request(url: str, body: Any = None, *, method: str = "POST", headers: dict[str, str] | None = None,
            opener: urllib.request.OpenerDirector | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    sent = urllib.request.Request(url, data=data, method=method,
                                  headers={"Content-Type": "application/json", **_SENT_TOKEN, **(headers or {})})
    try:
        with (opener.open if opener else urllib.request.urlopen)(sent, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def dependency_outputs(base: str, token: str | None = None) -> list[str]:
    """Each callback's output string (with Dash's @hash suffixes)."""
    _, text = request(base + "/_dash-dependencies", method="GET",
                      headers={"Authorization": f"Bearer {token}"} if token else None)
    return [callback["output"] for callback in json.loads(text)]


def _outputs(spec: str) -> list[dict[str, str]]:
    return [dict(zip(("id", "property"), part.rsplit(".", 1))) for part in spec.strip(".").split("...")]


def act_body(base: str, trigger: str, trial: Any, target: str = "loss", condition: str = "has_nan",
             token: str | None = None) -> dict[str, Any]:
    """What the browser posts when a Breakpoints tab control is clicked."""
    output = next(o for o in dependency_outputs(base, token) if "bp-message.children" in o)
    clicks = {button: int(button == trigger) for button in ("bp-add", "bp-continue", "bp-step", "bp-abort")}
    return {"output": output, "outputs": _outputs(output),
            "inputs": [*({"id": b, "property": "n_clicks", "value": n} for b, n in clicks.items()), [], []],
            "state": [{"id": "current-trial", "property": "data", "value": trial},
                      {"id": "bp-target", "property": "value", "value": target},
                      {"id": "bp-condition", "property": "value", "value": condition}],
            "changedPropIds": [f"{trigger}.n_clicks"]}


def refresh_body(base: str, trial: Any) -> dict[str, Any]:
    output = next(o for o in dependency_outputs(base) if o.startswith("..bp-table.children...") and "@" not in o)
    return {"output": output, "outputs": _outputs(output),
            "inputs": [{"id": "tabs", "property": "active_tab", "value": "breakpoints"},
                       {"id": "current-trial", "property": "data", "value": trial},
                       {"id": "bp-poll", "property": "n_intervals", "value": 1}],
            "state": [{"id": "bp-shown", "property": "data", "value": None}], "changedPropIds": ["bp-poll.n_intervals"]}


@pytest.fixture
def group(fresh_recording: Path) -> Path:
    return fresh_recording


def the_trial(group: Path) -> str:
    (trial,) = [p.name for p in (group / "trials").iterdir()]
    return trial


# -- a service on this machine that is not a paused run of the recording ---------------------------------
LISTENER = """
import socket, sys
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.bind(("127.0.0.1", 0))
server.listen(4)
print(server.getsockname()[1], flush=True)
while True:
    connection, _ = server.accept()
    with connection, open(sys.argv[1], "ab") as log:
        log.write(b"connected ")
        connection.settimeout(2)
        try:
            log.write(connection.recv(4096))
            connection.sendall(b'{"ok": true, "action": "continue"}\\n')
        except OSError:
            pass
"""


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    log = tmp_path / "listener.log"
    process = subprocess.Popen([sys.executable, "-c", LISTENER, str(log)], stdout=subprocess.PIPE, text=True)
    port = int(process.stdout.readline())  # type: ignore[union-attr]
    yield process, port, log
    process.kill()
    process.communicate()


@pytest.fixture
def victim(tmp_path: Path, listener: tuple[subprocess.Popen[str], int, Path]) -> Path:
    """A folder outside the recording whose live/run.json says "a run paused here, at the listener's port"
    (written by that listening process's owner: its pid, this host)."""
    process, port, _ = listener
    folder = tmp_path / "victim"
    (folder / "live").mkdir(parents=True)
    (folder / "live" / "run.json").write_text(json.dumps({
        "state": "paused", "training_step": 4242, "pid": process.pid, "hostname": socket.gethostname(),
        "host": "127.0.0.1", "port": port, "token": "t" * 32}))
    return folder


def _untouched(victim: Path, log: Path) -> None:
    assert sorted(p.name for p in (victim / "live").iterdir()) == ["run.json"], "the app wrote outside the recording"
    assert not log.exists() or log.read_bytes() == b"", "the app connected where a file outside the recording said"


# -- item 1: the trial a callback gets from the browser is one the recording holds ----------------------
TRIALS_OUTSIDE = {"absolute": lambda victim: str(victim), "relative": lambda victim: "../../victim",
                  "deeper": lambda victim: "x/../../../victim"}


@pytest.mark.parametrize("trigger", ["bp-add", "bp-continue", "bp-abort"])
@pytest.mark.parametrize("where", list(TRIALS_OUTSIDE))
def test_an_action_for_a_trial_outside_the_recording_touches_nothing(group, victim, listener, trigger, where) -> None:
    trial = TRIALS_OUTSIDE[where](victim)
    assert (group / "trials" / trial).resolve() == victim.resolve()  # the path the old code built
    with served(group) as (base, _):
        status, text = request(base + UPDATE, act_body(base, trigger, trial))
    assert status in (200, 204) or 400 <= status < 500, text[:300]
    assert "Traceback" not in text
    _untouched(victim, listener[2])
    if status == 200:
        assert "No trial" in text, text[:500]


@pytest.mark.parametrize("where", list(TRIALS_OUTSIDE))
def test_the_panel_does_not_show_a_run_outside_the_recording(group, victim, listener, where) -> None:
    with served(group) as (base, _):
        status, text = request(base + UPDATE, refresh_body(base, the_trial(group)))
        assert status == 200 and "No breakpoints" in text, text[:300]  # the body is one the app answers
        status, text = request(base + UPDATE, refresh_body(base, TRIALS_OUTSIDE[where](victim)))
    assert "4242" not in text and "paused" not in text, text[:500]
    _untouched(victim, listener[2])


def test_every_callback_given_a_trial_outside_the_recording_touches_nothing(group, victim, listener) -> None:
    """Every server-side callback, with every string and every "trial" field of its inputs replaced."""
    outside = str(victim)

    def hostile(value: Any) -> Any:
        if isinstance(value, str):
            return outside
        if isinstance(value, dict):
            return {k: (outside if k == "trial" else hostile(v)) for k, v in value.items()}
        return value

    with served(group) as (base, _):
        _, text = request(base + "/_dash-dependencies", method="GET")
        for callback in json.loads(text):
            if callback.get("clientside_function"):
                continue
            body = {"output": callback["output"], "outputs": _outputs(callback["output"])
                    if callback["output"].startswith("..") else dict(zip(("id", "property"),
                                                                          callback["output"].rsplit(".", 1))),
                    "inputs": [[] if "[" in d["id"] else {**d, "value": hostile(d["id"])} for d in callback["inputs"]],
                    "state": [[] if "[" in d["id"] else {**d, "value": outside} for d in callback["state"]],
                    "changedPropIds": [f"{callback['inputs'][0]['id']}.{callback['inputs'][0]['property']}"]}
            for trigger in ("bp-add", "bp-continue", "bp-abort"):  # also each click of the Breakpoints tab
                if "bp-message" in callback["output"]:
                    body = act_body(base, trigger, outside)
                status, answer = request(base + UPDATE, body)
                assert status != 500 and "Traceback" not in answer, (callback["output"], answer[:300])
    _untouched(victim, listener[2])


# -- item 7 through the doors: a live/ or a trial folder that is a link ----------------------------------
@pytest.mark.parametrize("link", ["live", "trial"])
def test_a_link_out_of_the_recording_is_not_written_through(group, tmp_path, link) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    trial = the_trial(group)
    if link == "live":
        (group / "trials" / trial / "live").symlink_to(outside, target_is_directory=True)
    else:
        shutil.copy(group / "trials" / trial / "trial.json", outside / "trial.json")
        (group / "trials" / "linked").symlink_to(outside, target_is_directory=True)
        trial = "linked"
    with served(group) as (base, _):
        status, text = request(f"{base}/api/v1/trials/{trial}/breakpoints", {"target": "loss", "condition": "has_nan"})
        assert 400 <= status < 500, (status, text[:300])
        status, text = request(base + UPDATE, act_body(base, "bp-add", trial))
        assert status != 500 and "Added" not in text, text[:300]
    assert sorted(p.name for p in outside.iterdir()) == ([] if link == "live" else ["trial.json"])


# -- item 2: the app's actions need the REST API's token ------------------------------------------------
class PausedRun:
    """A run of the recording's trial, paused in a thread of this process (wait_for_command, as a trainer)."""

    def __init__(self, trial_dir: Path):
        self.trial_dir, self.answers = trial_dir, []
        state = {"training_step": 3, "pid": os.getpid(), "hostname": socket.gethostname(), "breakpoint": None}
        self.thread = threading.Thread(target=lambda: self.answers.append(
            control.wait_for_command(trial_dir, state, 60)), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while control.run_state(trial_dir)["state"] != "paused" and time.monotonic() < deadline:
            time.sleep(0.01)

    def end(self) -> None:
        if self.thread.is_alive():
            control.send_command(self.trial_dir, "continue")
        self.thread.join(10)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_the_app_s_actions_need_the_token_on_loopback_too(group, host) -> None:
    """Issue 31 item 5: any local user reaches 127.0.0.1, so the token guards every change there as well."""
    trial = the_trial(group)
    run = PausedRun(group / "trials" / trial)
    try:
        with served(group, host=host, send_token=False) as (base, app):
            token = app.server.config[api.TOKEN_CONFIG]
            assert token
            foreign = {"Host": "evil.example"} if host == "0.0.0.0" else {}
            # As the REST API refuses an abort without the token, so does the tab's callback.
            assert request(f"{base}/api/v1/trials/{trial}/run/abort", headers=foreign)[0] == 401
            for trigger in ("bp-abort", "bp-add"):  # off loopback the request itself is refused (401)
                status, text = request(base + UPDATE, act_body(base, trigger, trial, token=token), headers=foreign)
                assert status in (200, 401) and "token" in text, text[:300]
            assert run.thread.is_alive() and control.run_state(run.trial_dir)["state"] == "paused"
            assert control.list_breakpoints(run.trial_dir) == []
            # A wrong cookie, a wrong bearer token: refused too.
            for headers in ({"Cookie": f"{doors.TOKEN_COOKIE}=wrong"}, {"Authorization": "Bearer wrong"}):
                status, text = request(base + UPDATE, act_body(base, "bp-add", trial, token=token), headers=headers)
                assert "Added" not in text and "token" in text, text[:300]
            # The link the server prints sets the cookie (and drops the token from the address) ...
            jar = http.cookiejar.CookieJar()
            browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
            status, _ = request(f"{base}/?token={token}", method="GET", opener=browser)
            assert status == 200 and [c.name for c in jar] == [doors.TOKEN_COOKIE]
            # ... but the cookie from another web origin is refused (the page of evil.example posting here).
            status, text = request(base + UPDATE, act_body(base, "bp-add", trial, token=token), opener=browser,
                                   headers={"Origin": "http://evil.example"})
            assert "Added" not in text, text[:300]
            # With the cookie, from the page itself, the actions work, in the app and in the REST API alike.
            status, text = request(base + UPDATE, act_body(base, "bp-add", trial, token=token), opener=browser)
            assert "Added bp1" in text, text[:300]
            status, _ = request(f"{base}/api/v1/trials/{trial}/breakpoints", {"target": "loss", "condition": "has_nan"},
                                opener=browser)
            assert status == 201
            status, text = request(base + UPDATE, act_body(base, "bp-step", trial, token=token),
                                   headers={"Authorization": f"Bearer {token}"})
            assert "Sent step" in text, text[:300]
            run.thread.join(10)
            assert run.answers == ["step"]
    finally:
        run.end()


def test_bound_to_loopback_foreign_hosts_are_refused_on_every_route(group) -> None:
    trial = the_trial(group)
    with served(group) as (base, _):
        for path, body in ((UPDATE, act_body(base, "bp-add", trial)),
                           (f"/api/v1/trials/{trial}/breakpoints", {"target": "loss", "condition": "has_nan"}),
                           ("/_dash-layout", None), ("/api/v1/trials", None)):
            status, _ = request(base + path, body, method="POST" if body else "GET", headers={"Host": "evil.example"})
            assert status == 403, path
    assert control.list_breakpoints(group / "trials" / trial) == []
