"""comgra.breakpoints.control without torch: the files, the lock, the token, the states."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from comgra.errors import BreakpointError, NotPaused, StoreError, UnknownBreakpoint
from comgra.breakpoints import control


@pytest.fixture
def trial_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "group" / "trials" / "t"
    directory.mkdir(parents=True)
    return directory


def _pause_in_thread(trial_dir: Path, timeout: float | None = None) -> tuple[threading.Thread, list[str]]:
    answers: list[str] = []
    state = {"training_step": 7, "pid": os.getpid(), "hostname": socket.gethostname(), "breakpoint": "bp1"}
    thread = threading.Thread(target=lambda: answers.append(control.wait_for_command(trial_dir, state, timeout)))
    thread.start()
    deadline = time.monotonic() + 10
    while control.run_state(trial_dir)["state"] != "paused" and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread, answers


def test_breakpoints_are_added_updated_listed_and_removed(trial_dir: Path) -> None:
    first = control.add_breakpoint(trial_dir, "loss", "has_nan")
    second = control.add_breakpoint(trial_dir, "net.b1", "abs_max > 1e4", enabled=False)
    assert (first["id"], second["id"]) == ("bp1", "bp2")
    assert control.update_breakpoint(trial_dir, "bp2", enabled=True, condition="abs_max > 10")["condition"] == "abs_max > 10"
    control.remove_breakpoint(trial_dir, "bp1")
    assert control.list_breakpoints(trial_dir) == [
        {"id": "bp2", "target": "net.b1", "condition": "abs_max > 10", "enabled": True, "hits": 0}]
    assert control.add_breakpoint(trial_dir, "x", "has_inf")["id"] == "bp3"  # ids are never reused
    with pytest.raises(UnknownBreakpoint, match="'bp1'.*did you mean"):
        control.remove_breakpoint(trial_dir, "bp1")


@pytest.mark.parametrize("target, condition, enabled, field", [
    ("", "has_nan", True, "target"), (3, "has_nan", True, "target"), ("a\nb", "has_nan", True, "target"),
    ("loss", "import os", True, "condition"), ("loss", "has_nan", "yes", "enabled"),
])
def test_bad_fields_are_named(trial_dir: Path, target: object, condition: object, enabled: object, field: str) -> None:
    with pytest.raises(BreakpointError) as caught:
        control.add_breakpoint(trial_dir, target, condition, enabled)
    assert caught.value.field == field
    assert control.list_breakpoints(trial_dir) == []


def test_no_trial_folder_is_created_for_an_unknown_trial(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="No trial folder"):
        control.add_breakpoint(tmp_path / "nope", "loss", "has_nan")
    assert not (tmp_path / "nope").exists()


def test_a_live_folder_another_process_makes_first_is_used(trial_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes that find no live/ both make it; the one that comes second goes on (it raised
    FileExistsError, one run in three of the two-process test below)."""
    real_mkdir = os.mkdir

    def the_other_process_was_first(path: str | Path, mode: int = 0o777) -> None:
        real_mkdir(path, 0o700)
        raise FileExistsError(17, "File exists", str(path))
    monkeypatch.setattr(os, "mkdir", the_other_process_was_first)
    control.add_breakpoint(trial_dir, "loss", "has_nan")
    monkeypatch.undo()
    assert [b["target"] for b in control.list_breakpoints(trial_dir)] == ["loss"]


def test_concurrent_edits_from_two_processes_lose_nothing(trial_dir: Path) -> None:
    code = ("import sys; from comgra.breakpoints import control\n"
            "for i in range(15): control.add_breakpoint(sys.argv[1], f'{sys.argv[2]}{i}', 'has_nan')")
    processes = [subprocess.Popen([sys.executable, "-c", code, str(trial_dir), name]) for name in ("a", "b")]
    assert [process.wait(timeout=120) for process in processes] == [0, 0]  # both waited for, pass or fail
    listed = control.list_breakpoints(trial_dir)
    assert len(listed) == 30 and len({b["id"] for b in listed}) == 30
    assert {b["target"] for b in listed} == {f"{n}{i}" for n in "ab" for i in range(15)}


def test_a_paused_run_obeys_a_command_with_its_token_only(trial_dir: Path) -> None:
    thread, answers = _pause_in_thread(trial_dir)
    document = json.loads((trial_dir / "live" / "run.json").read_text())
    with socket.create_connection(("127.0.0.1", document["port"]), timeout=5) as connection:
        connection.sendall(json.dumps({"token": "guess", "action": "abort"}).encode() + b"\n")
        assert json.loads(connection.recv(4096)) == {"ok": False, "error": "wrong token"}
    with pytest.raises(BreakpointError, match="action='resume'"):
        control.send_command(trial_dir, "resume")
    assert thread.is_alive() and not answers
    assert control.send_command(trial_dir, "step") == {"ok": True, "action": "step"}
    thread.join(5)
    assert answers == ["step"]


@pytest.mark.parametrize(("action", "state"), [("continue", "running"), ("step", "running"), ("abort", "finished")])
def test_the_sender_of_a_command_reads_the_new_state_as_soon_as_it_is_answered(
        trial_dir: Path, action: str, state: str) -> None:
    """The app's panel re-reads the state in the callback that sent the command: no stale "paused"."""
    thread, answers = _pause_in_thread(trial_dir)
    control.send_command(trial_dir, action)
    after = control.run_state(trial_dir)
    assert after["state"] == state and after["training_step"] == 7
    assert after["breakpoint"] == (None if state == "running" else "bp1")
    thread.join(5)
    assert answers == [action]


def test_a_pause_with_a_timeout_continues_by_itself(trial_dir: Path) -> None:
    started = time.monotonic()
    thread, answers = _pause_in_thread(trial_dir, timeout=0.3)
    thread.join(10)
    assert answers == ["continue"] and 0.25 < time.monotonic() - started < 5


def test_a_run_whose_process_is_gone_is_unknown_and_takes_no_command(trial_dir: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    control.write_run_state(trial_dir, {"state": "paused", "training_step": 3, "pid": process.pid,
                                        "hostname": socket.gethostname(), "port": 9, "token": "x"})
    assert control.run_state(trial_dir)["state"] == "unknown"
    with pytest.raises(NotPaused):
        control.send_command(trial_dir, "continue")
    assert control.run_state(trial_dir.parent / "other")["state"] == "unknown"
