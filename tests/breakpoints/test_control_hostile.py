"""The control channel of a paused run under attack: real sockets, real files, real modes.

A paused run listens on 127.0.0.1 for one command line. Whatever arrives there (a line nested
100,000 deep, a non-ASCII token, a client that connects and says nothing, random bytes) leaves the run
paused and its state unchanged; only a well-formed command with the right token acts. The files
holding the token are never readable by another user, not even for an instant; a recording cannot
make ``send_command`` connect anywhere but to the process of this machine that published it; and a
``live/`` that is a link is never written through.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comgra.errors import ComgraError, NotPaused, StoreError
from comgra.breakpoints import control


@pytest.fixture
def trial_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "group" / "trials" / "t"
    directory.mkdir(parents=True)
    return directory


class Paused:
    """A run paused in a thread of this process (wait_for_command, as the training process calls it)."""

    def __init__(self, trial_dir: Path, timeout: float | None = None):
        self.trial_dir = trial_dir
        self.answers: list[str] = []
        self.errors: list[BaseException] = []
        state = {"training_step": 7, "pid": os.getpid(), "hostname": socket.gethostname(), "breakpoint": "bp1"}
        self.thread = threading.Thread(target=self._wait, args=(state, timeout), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while control.run_state(trial_dir)["state"] != "paused" and time.monotonic() < deadline:
            time.sleep(0.01)
        self.document = json.loads((trial_dir / "live" / "run.json").read_text())

    def _wait(self, state: dict, timeout: float | None) -> None:
        try:
            self.answers.append(control.wait_for_command(self.trial_dir, state, timeout))
        except BaseException as error:  # noqa: BLE001 - the test reports it
            self.errors.append(error)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.document["port"]), timeout=10)

    def send_raw(self, data: bytes) -> bytes:
        with self.connect() as connection:
            try:
                connection.sendall(data)
                connection.shutdown(socket.SHUT_WR)
            except OSError:  # the run closed the connection before all of it was sent (it is too long)
                pass
            return _read_all(connection)

    def assert_still_paused(self) -> None:
        assert not self.errors, self.errors
        assert self.thread.is_alive() and not self.answers
        state = control.run_state(self.trial_dir)
        assert state["state"] == "paused" and state["training_step"] == 7 and state["breakpoint"] == "bp1"

    def end(self) -> None:
        if self.thread.is_alive():
            control.send_command(self.trial_dir, "continue")
        self.thread.join(10)


def _read_all(connection: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = connection.recv(4096)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data


@pytest.fixture
def paused(trial_dir: Path) -> Iterator[Paused]:
    run = Paused(trial_dir)
    yield run
    run.end()


# -- item 4: the socket authenticates before acting, bounds what it parses, never changes state on junk --
def _command(token: object, action: object = "abort") -> bytes:
    return json.dumps({"token": token, "action": action}).encode() + b"\n"


HOSTILE_LINES = {
    "nested_100000": b"[" * 100_000 + b"\n",
    "nested_object": b'{"token": ' + b"[" * 5000 + b"\n",
    "non_ascii_token": _command("\u00e9\u00e9\u00e9"),
    "token_not_a_string": _command(["x"]),
    "token_huge": _command("a" * 1_000_000),
    "no_token": b'{"action": "abort"}\n',
    "not_json": b"abort\n",
    "not_utf8": b"\xff\xfe\xfd\n",
    "a_list": b'["abort"]\n',
    "empty_line": b"\n",
    "nothing": b"",
    "many_lines": b'{"action": "abort"}\n' * 1000,
}


@pytest.mark.parametrize("line", list(HOSTILE_LINES.values()), ids=list(HOSTILE_LINES))
def test_a_hostile_line_leaves_the_run_paused_and_a_real_command_still_works(paused: Paused, line: bytes) -> None:
    reply = paused.send_raw(line)
    assert b"Traceback" not in reply
    if reply:
        assert json.loads(reply.split(b"\n")[0])["ok"] is False
    time.sleep(0.1)
    paused.assert_still_paused()
    assert control.send_command(paused.trial_dir, "step") == {"ok": True, "action": "step"}
    paused.thread.join(10)
    assert paused.answers == ["step"]


def test_a_wrong_token_with_a_valid_action_is_refused(paused: Paused) -> None:
    reply = paused.send_raw(_command("0" * 32, "abort"))
    assert json.loads(reply) == {"ok": False, "error": "wrong token"}
    paused.assert_still_paused()


def test_a_silent_client_does_not_block_a_real_command(paused: Paused) -> None:
    """A client that trickles bytes and never ends its line must not hold the only listener."""
    stop = threading.Event()

    def trickle() -> None:
        with paused.connect() as connection:
            while not stop.is_set():
                try:
                    connection.sendall(b" ")
                except OSError:
                    return
                stop.wait(0.2)

    idle = [paused.connect() for _ in range(3)]  # and a few that send nothing at all
    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        assert control.send_command(paused.trial_dir, "step") == {"ok": True, "action": "step"}
        paused.thread.join(10)
        assert paused.answers == ["step"]
    finally:
        stop.set()
        thread.join(5)
        for connection in idle:
            connection.close()


def test_an_idle_client_is_dropped(paused: Paused) -> None:
    with paused.connect() as connection:
        connection.settimeout(control.CLIENT_TIMEOUT_S + 10)
        assert connection.recv(100) == b""  # the run closed it: it waits for nobody
    paused.assert_still_paused()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(max_size=300) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["token", "action", "x"]), inner,
                                                                 max_size=3), max_leaves=8).map(
    lambda value: json.dumps(value).encode() + b"\n"))
def test_fuzzed_messages_never_act_without_the_token(paused: Paused, junk: bytes) -> None:
    paused.send_raw(junk)
    paused.assert_still_paused()


# -- item 3: the token is never readable by another user ----------------------------------------------
def test_the_files_holding_the_token_are_private_from_the_start(trial_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a umask that lets everyone read, run.json is 0600 and live/ 0700, and the temporary file that
    becomes run.json was 0600 before it was renamed (never chmod-ed afterwards)."""
    modes_before_rename: dict[str, int] = {}
    real_replace = os.replace

    def replace(source: str | Path, target: str | Path) -> None:
        modes_before_rename[Path(target).name] = stat.S_IMODE(os.stat(source).st_mode)
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)
    previous = os.umask(0)
    try:
        run = Paused(trial_dir)
    finally:
        os.umask(previous)
    try:
        assert stat.S_IMODE(os.stat(trial_dir / "live").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(trial_dir / "live" / "run.json").st_mode) == 0o600
        assert modes_before_rename["run.json"] == 0o600
    finally:
        run.end()


def test_an_existing_live_folder_open_to_others_is_closed(trial_dir: Path) -> None:
    (trial_dir / "live").mkdir(mode=0o777)
    os.chmod(trial_dir / "live", 0o777)
    run = Paused(trial_dir)
    try:
        assert stat.S_IMODE(os.stat(trial_dir / "live").st_mode) == 0o700
    finally:
        run.end()


# -- item 5: a recording does not decide where the app connects ---------------------------------------
LISTENER = """
import socket, sys
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.bind((sys.argv[1], 0))
server.listen(4)
print(server.getsockname()[1], flush=True)
while True:
    connection, _ = server.accept()
    with connection, open(sys.argv[2], "ab") as log:
        log.write(b"connected\\n")
        connection.settimeout(2)
        try:
            log.write(connection.recv(4096) + b"\\n")
            connection.sendall(b'{"ok": true, "action": "continue"}\\n')
        except OSError:
            pass
"""


class Listener:
    """A service on this machine that is not the paused run (another process): it logs every connection."""

    def __init__(self, host: str, log: Path):
        self.log = log
        self.process = subprocess.Popen([sys.executable, "-c", LISTENER, host, str(log)], stdout=subprocess.PIPE,
                                        text=True)
        self.port = int(self.process.stdout.readline())  # type: ignore[union-attr]

    def received(self) -> bytes:
        return self.log.read_bytes() if self.log.exists() else b""

    def close(self) -> None:
        self.process.kill()
        self.process.communicate()


@pytest.mark.parametrize("case", ["this_process_is_not_listening", "other_host_name", "not_loopback", "dead_pid"])
def test_send_command_connects_only_to_the_run_that_published_the_state(trial_dir: Path, tmp_path: Path,
                                                                         case: str) -> None:
    """run.json names this test's process (alive, on this host) and the port of another process's service."""
    listener = Listener("0.0.0.0" if case == "not_loopback" else "127.0.0.1", tmp_path / "listener.log")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    document = {"state": "paused", "training_step": 3, "pid": os.getpid(), "hostname": socket.gethostname(),
                "host": "127.0.0.1", "port": listener.port, "token": "x" * 32}
    document.update({"this_process_is_not_listening": {}, "other_host_name": {"hostname": "elsewhere.example"},
                     "not_loopback": {"host": "0.0.0.0"}, "dead_pid": {"pid": dead.pid}}[case])
    control.write_run_state(trial_dir, document)
    try:
        with pytest.raises(ComgraError) as caught:
            control.send_command(trial_dir, "continue")
        assert isinstance(caught.value, NotPaused) or "refuse" in str(caught.value).lower()
        time.sleep(0.3)
        assert listener.received() == b"", "send_command connected to a service that is not the paused run"
    finally:
        listener.close()


def test_send_command_reaches_a_paused_run_of_another_process(trial_dir: Path) -> None:
    """The real case: the training process (a child here) listens; the app (this process) sends."""
    code = ("import os, socket, sys; from comgra.breakpoints import control\n"
            "state = {'training_step': 4, 'pid': os.getpid(), 'hostname': socket.gethostname()}\n"
            "print(control.wait_for_command(sys.argv[1], state, 60), flush=True)")
    child = subprocess.Popen([sys.executable, "-c", code, str(trial_dir)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while control.run_state(trial_dir)["state"] != "paused" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert control.send_command(trial_dir, "step") == {"ok": True, "action": "step"}
        assert child.communicate(timeout=30)[0].strip() == "step"
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


# -- item 7: live/ as a link is never written through -------------------------------------------------
@pytest.mark.parametrize("edit", ["add", "replace", "run_state"])
def test_a_live_folder_that_is_a_link_is_refused(trial_dir: Path, tmp_path: Path, edit: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (trial_dir / "live").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoreError, match="link"):
        if edit == "add":
            control.add_breakpoint(trial_dir, "loss", "has_nan")
        elif edit == "replace":
            control.replace_breakpoints(trial_dir, [{"target": "loss", "condition": "has_nan"}])
        else:
            control.write_run_state(trial_dir, {"state": "running"})
    assert list(outside.iterdir()) == []


def test_files_in_live_that_are_links_are_not_followed(trial_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"next_id": 1, "breakpoints": [{"id": "bp1", "target": "stolen",
                                                                 "condition": "has_nan", "enabled": True}]}))
    (trial_dir / "live").mkdir()
    (trial_dir / "live" / "breakpoints.json").symlink_to(secret)
    (trial_dir / "live" / "run.json").symlink_to(secret)
    with pytest.raises(ComgraError, match="link"):
        control.list_breakpoints(trial_dir)
    assert control.read_run_document(trial_dir) == {}


# -- item 6 (the file side): a hand-edited breakpoints.json is damaged, named, never a crash ------------
DAMAGED_BREAKPOINTS = {
    "entry_without_id": {"next_id": 2, "breakpoints": [{"target": "loss", "condition": "has_nan", "enabled": True}]},
    "entry_without_target": {"next_id": 2, "breakpoints": [{"id": "bp1", "condition": "has_nan", "enabled": True}]},
    "entry_not_an_object": {"next_id": 2, "breakpoints": ["bp1", 3, None]},
    "bad_condition": {"next_id": 2, "breakpoints": [{"id": "bp1", "target": "loss", "condition": "__import__('os')"}]},
    "id_not_a_string": {"next_id": 2, "breakpoints": [{"id": [1], "target": "loss", "condition": "has_nan"}]},
    "next_id_not_a_number": {"next_id": "x", "breakpoints": []},
    "breakpoints_not_a_list": {"next_id": 1, "breakpoints": {"a": 1}},
}


@pytest.mark.parametrize("document", list(DAMAGED_BREAKPOINTS.values()), ids=list(DAMAGED_BREAKPOINTS))
def test_a_damaged_breakpoints_file_is_a_clear_error_and_is_not_overwritten(trial_dir: Path, document: dict) -> None:
    (trial_dir / "live").mkdir()
    path = trial_dir / "live" / "breakpoints.json"
    path.write_text(json.dumps(document))
    for read in (control.read_breakpoints, control.list_breakpoints,
                 lambda d: control.add_breakpoint(d, "loss", "has_nan")):
        with pytest.raises(ComgraError, match="breakpoints.json"):
            read(trial_dir)
    assert json.loads(path.read_text()) == document


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"breakpoints": ' + b"[" * 100_000, b"\xff\xfe",
                                 b" " * (2 * 1024 * 1024)])
def test_an_unparseable_breakpoints_file_is_a_clear_error(trial_dir: Path, raw: bytes) -> None:
    (trial_dir / "live").mkdir()
    (trial_dir / "live" / "breakpoints.json").write_bytes(raw)
    with pytest.raises(ComgraError, match="breakpoints.json"):
        control.read_breakpoints(trial_dir)
