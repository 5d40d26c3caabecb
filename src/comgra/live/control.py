"""Breakpoints and run control of a trial, through files under ``<trial_dir>/live/`` and a local socket.

No torch here: the app and the REST API (separate processes, maybe without torch) call these
functions; the training process (``comgra.live.breakpoints``) reads the same files.

- ``breakpoints.json``: the breakpoints, written atomically under a lock by whoever edits them.
- ``run.json``: the training process's state (``running``, ``paused``, ``finished``), the step, the
  breakpoint that paused it, hit counts, and the 127.0.0.1 port and random token on which a paused
  run accepts one command (``continue``, ``step`` or ``abort``).

    >>> from comgra.live import control                                        # doctest: +SKIP
    >>> control.add_breakpoint(trial_dir, "loss", "has_nan")                   # doctest: +SKIP
    {'id': 'bp1', 'target': 'loss', 'condition': 'has_nan', 'enabled': True, 'hits': 0}
    >>> control.send_command(trial_dir, "continue")                            # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from comgra.errors import BreakpointError, ComgraError, NotPaused, StoreError, UnknownBreakpoint, did_you_mean
from comgra.live.conditions import parse_condition
from comgra.store import validation

__all__ = ["ACTIONS", "add_breakpoint", "list_breakpoints", "remove_breakpoint", "run_state", "send_command",
           "update_breakpoint", "live_dir", "replace_breakpoints", "write_run_state", "read_run_document",
           "wait_for_command", "read_breakpoints", "breakpoints_signature", "checked_breakpoint"]

ACTIONS = ("continue", "step", "abort")
LIVE_DIR = "live"
BREAKPOINTS_FILE = "breakpoints.json"
RUN_FILE = "run.json"
MAX_TARGET_LENGTH = 300
COMMAND_TIMEOUT_S = 10.0


def live_dir(trial_dir: str | Path) -> Path:
    return Path(trial_dir) / LIVE_DIR


# -- breakpoints -------------------------------------------------------------------------------------
def list_breakpoints(trial_dir: str | Path) -> list[dict[str, Any]]:
    """Every breakpoint of the trial with its hit count (hits are counted by the training process)."""
    hits = read_run_document(trial_dir).get("hits", {})
    return [{**entry, "hits": hits.get(entry["id"], 0)} for entry in _read_breakpoints(trial_dir)["breakpoints"]]


def add_breakpoint(trial_dir: str | Path, target: object, condition: object, enabled: object = True) -> dict[str, Any]:
    """Validate and add a breakpoint; BreakpointError names the bad field."""
    entry = {"target": _check_target(target), "condition": _check_condition(condition),
             "enabled": _check_enabled(enabled)}
    with _locked(trial_dir):
        document = _read_breakpoints(trial_dir)
        document["next_id"] = int(document.get("next_id", 1))
        entry = {"id": f"bp{document['next_id']}", **entry}
        document["next_id"] += 1
        document["breakpoints"].append(entry)
        _write_breakpoints(trial_dir, document)
    return {**entry, "hits": 0}


def update_breakpoint(trial_dir: str | Path, breakpoint_id: str, *, enabled: object = None, condition: object = None,
                      target: object = None) -> dict[str, Any]:
    """Change the given fields of one breakpoint (None leaves a field as it is)."""
    changes: dict[str, Any] = {}
    if enabled is not None:
        changes["enabled"] = _check_enabled(enabled)
    if condition is not None:
        changes["condition"] = _check_condition(condition)
    if target is not None:
        changes["target"] = _check_target(target)
    with _locked(trial_dir):
        document = _read_breakpoints(trial_dir)
        entry = _find(document, breakpoint_id)
        entry.update(changes)
        _write_breakpoints(trial_dir, document)
    hits = read_run_document(trial_dir).get("hits", {})
    return {**entry, "hits": int(hits.get(entry["id"], 0))}


def remove_breakpoint(trial_dir: str | Path, breakpoint_id: str) -> None:
    with _locked(trial_dir):
        document = _read_breakpoints(trial_dir)
        entry = _find(document, breakpoint_id)
        document["breakpoints"].remove(entry)
        _write_breakpoints(trial_dir, document)


def replace_breakpoints(trial_dir: str | Path, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start a run with exactly these breakpoints (from the config file or the recorder's arguments)."""
    checked = [{"id": f"bp{i}", **checked_breakpoint(e)} for i, e in enumerate(entries, start=1)]
    with _locked(trial_dir):
        _write_breakpoints(trial_dir, {"next_id": len(checked) + 1, "breakpoints": checked})
    return checked


def checked_breakpoint(entry: object) -> dict[str, Any]:
    """A breakpoint given as a mapping (recorder argument, config file), validated; BreakpointError names the field."""
    if not isinstance(entry, dict):
        raise BreakpointError(f"breakpoint {entry!r} must be a dict such as "
                              "{'target': 'loss', 'condition': 'has_nan'}.", field="breakpoint")
    unknown = sorted(set(entry) - {"id", "target", "condition", "enabled", "hits"})
    if unknown:
        raise BreakpointError(f"breakpoint {entry!r} has unknown keys {unknown}; known: target, condition, enabled.",
                              field=unknown[0])
    return {"target": _check_target(entry.get("target")), "condition": _check_condition(entry.get("condition")),
            "enabled": _check_enabled(entry.get("enabled", True))}


def breakpoints_signature(trial_dir: str | Path) -> tuple[int, int] | None:
    """(mtime_ns, size) of breakpoints.json, so a training process re-reads it only when it changed."""
    try:
        stat = os.stat(live_dir(trial_dir) / BREAKPOINTS_FILE)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def read_breakpoints(trial_dir: str | Path) -> list[dict[str, Any]]:
    """The breakpoints as stored (without hit counts), for the training process."""
    return list(_read_breakpoints(trial_dir)["breakpoints"])


# -- run state and commands -----------------------------------------------------------------------
def run_state(trial_dir: str | Path) -> dict[str, Any]:
    """{"state": "running"|"paused"|"finished"|"unknown", "training_step", "breakpoint", "ranks", ...}.

    "unknown": no run has published a state, or its process on this host is gone without finishing.
    """
    document = read_run_document(trial_dir)
    state = document.get("state", "unknown")
    if state in ("running", "paused") and not _process_alive(document):
        state = "unknown"
    return {"state": state, "training_step": document.get("training_step"),
            "breakpoint": document.get("breakpoint"), "ranks": document.get("ranks", 1),
            "type_of_execution": document.get("type_of_execution"), "reason": document.get("reason"),
            "hits": dict(document.get("hits", {})), "updated": document.get("updated")}


def send_command(trial_dir: str | Path, action: str) -> dict[str, Any]:
    """Tell a paused run to ``continue``, ``step`` (pause again at the next step) or ``abort``."""
    if action not in ACTIONS:
        raise BreakpointError(f"action={action!r} is not a run command; use one of {list(ACTIONS)}.", field="action")
    document = read_run_document(trial_dir)
    if document.get("state") != "paused" or not _process_alive(document):
        raise NotPaused(f"The run of {str(trial_dir)!r} is not paused (state: {run_state(trial_dir)['state']!r}); "
                        f"{action!r} applies only to a run waiting at a breakpoint.")
    message = json.dumps({"token": document["token"], "action": action}).encode() + b"\n"
    try:
        with socket.create_connection((document.get("host", "127.0.0.1"), int(document["port"])),
                                      timeout=COMMAND_TIMEOUT_S) as connection:
            connection.sendall(message)
            reply = _read_line(connection)
    except OSError as error:
        raise NotPaused(f"The paused run of {str(trial_dir)!r} did not answer on port {document.get('port')} "
                        f"({error}); it may have resumed or ended. Check run_state().") from None
    answer = json.loads(reply or b"{}")
    if not answer.get("ok"):
        raise ComgraError(f"The run refused {action!r}: {answer.get('error', 'no answer')}")
    return answer


def read_run_document(trial_dir: str | Path) -> dict[str, Any]:
    """run.json as the training process writes it; {} ("unknown") for one that is damaged (unreadable, not a
    regular file, nested too deep), and a paused state without a usable token and port is no pause."""
    try:
        document = _read_live_json(live_dir(trial_dir) / RUN_FILE)
    except (OSError, ValueError):
        return {}
    if not isinstance(document, dict):
        return {}
    hits = document.get("hits", {})
    document["hits"] = {k: v for k, v in hits.items() if type(v) is int} if isinstance(hits, dict) else {}  # noqa: E721
    if document.get("state") == "paused" and not (isinstance(document.get("token"), str)
                                                  and type(document.get("port")) is int):  # noqa: E721
        document["state"] = "unknown"
    return document


def _read_live_json(path: Path) -> Any:
    """A document of live/: only a regular file is opened (a FIFO would block the app's request), and JSON
    nested deeper than Python parses is a ValueError like any other damage."""
    try:
        return json.loads(validation.read_regular_file(path))
    except RecursionError:
        raise ValueError(f"{str(path)!r} is nested too deeply") from None


def write_run_state(trial_dir: str | Path, document: dict[str, Any]) -> None:
    """Publish the training process's state (atomic: readers never see half a file)."""
    _write_atomic(live_dir(trial_dir) / RUN_FILE, {**document, "updated": time.time()})


def wait_for_command(trial_dir: str | Path, state: dict[str, Any], timeout: float | None) -> str:
    """Publish ``state`` as paused and block (no busy loop) until a valid command or ``timeout`` seconds.

    Listens on 127.0.0.1, an ephemeral port, for one line ``{"token", "action"}``; a wrong token is
    answered with an error and ignored. Returns the action, or "continue" when the timeout runs out.
    """
    token = secrets.token_hex(16)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        write_run_state(trial_dir, {**state, "state": "paused", "host": "127.0.0.1", "port": server.getsockname()[1],
                                    "token": token})
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return "continue"
            server.settimeout(remaining)
            try:
                connection, _ = server.accept()
            except socket.timeout:
                return "continue"
            action = _answer(connection, token, lambda action: _resumed(trial_dir, state, action))
            if action is not None:
                return action


def _resumed(trial_dir: str | Path, state: dict[str, Any], action: str) -> None:
    """Before the sender gets its answer: the run is no longer paused, so that whoever sent the command
    (the app, the REST API) reads the new state at once (the training process publishes it again as it goes)."""
    resumed = {**state, "state": "finished", "reason": "aborted"} if action == "abort" else \
        {**state, "state": "running", "breakpoint": None, "reason": None}
    with contextlib.suppress(OSError):  # a full disk must not lose the command: the process publishes later
        write_run_state(trial_dir, resumed)


def _answer(connection: socket.socket, token: str, accepted: Callable[[str], None]) -> str | None:
    with connection:
        connection.settimeout(COMMAND_TIMEOUT_S)
        try:
            request = json.loads(_read_line(connection) or b"{}")
        except (OSError, ValueError):
            return None
        ok = isinstance(request, dict) and hmac.compare_digest(str(request.get("token", "")), token)
        action = request.get("action") if ok else None
        if action not in ACTIONS:
            error = "wrong token" if not ok else f"unknown action {action!r}; use one of {list(ACTIONS)}"
            with contextlib.suppress(OSError):
                connection.sendall(json.dumps({"ok": False, "error": error}).encode() + b"\n")
            return None
        accepted(str(action))
        with contextlib.suppress(OSError):
            connection.sendall(json.dumps({"ok": True, "action": action}).encode() + b"\n")
        return str(action)


# -- internals ----------------------------------------------------------------------------------------
def _check_target(target: object) -> str:
    if not isinstance(target, str) or not target.strip():
        raise BreakpointError(f"target={target!r} must be the name of a registered tensor or of a tracked module "
                              "(e.g. 'loss' or 'net.b1.attn').", field="target")
    if len(target) > MAX_TARGET_LENGTH or any(ord(c) < 32 for c in target) or "*" in target:
        raise BreakpointError(f"target={target[:40]!r} is not a tensor or module name: at most "
                              f"{MAX_TARGET_LENGTH} characters, no control characters or '*'.", field="target")
    return target.strip()


def _check_condition(condition: object) -> str:
    return parse_condition(condition).text  # raises BreakpointError(field="condition")


def _check_enabled(enabled: object) -> bool:
    if not isinstance(enabled, bool):
        raise BreakpointError(f"enabled={enabled!r} must be true or false.", field="enabled")
    return enabled


def _find(document: dict[str, Any], breakpoint_id: str) -> dict[str, Any]:
    for entry in document["breakpoints"]:
        if entry["id"] == breakpoint_id:
            return entry
    known = [entry["id"] for entry in document["breakpoints"]]
    raise UnknownBreakpoint(f"No breakpoint {breakpoint_id!r}{did_you_mean(str(breakpoint_id), known)}")


def _read_breakpoints(trial_dir: str | Path) -> dict[str, Any]:
    try:
        document = _read_live_json(live_dir(trial_dir) / BREAKPOINTS_FILE)
    except FileNotFoundError:
        return {"next_id": 1, "breakpoints": []}
    except (OSError, ValueError) as error:
        raise ComgraError(f"{str(live_dir(trial_dir) / BREAKPOINTS_FILE)!r} cannot be read ({error}); "
                          "delete it to start without breakpoints.") from None
    if not isinstance(document, dict) or not isinstance(document.get("breakpoints"), list):
        return {"next_id": 1, "breakpoints": []}
    entries = document["breakpoints"]
    if not all(isinstance(e, dict) and isinstance(e.get("id"), str) for e in entries):
        raise ComgraError(f"{str(live_dir(trial_dir) / BREAKPOINTS_FILE)!r} holds entries that are not breakpoints "
                          "(each is an object with a string 'id'); delete the file to start without breakpoints.")
    return document


def _write_breakpoints(trial_dir: str | Path, document: dict[str, Any]) -> None:
    _write_atomic(live_dir(trial_dir) / BREAKPOINTS_FILE, document)


def _write_atomic(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(exist_ok=True)  # live/ only: a trial folder that is gone is never recreated
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(document, indent=1))
    os.replace(temporary, path)


@contextlib.contextmanager
def _locked(trial_dir: str | Path) -> Iterator[None]:
    """Serialise read-modify-write of breakpoints.json between the app, the API and the trainer."""
    directory = live_dir(trial_dir)
    if not Path(trial_dir).is_dir():
        raise StoreError(f"No trial folder {str(trial_dir)!r}; breakpoints belong to a trial that a recorder created.")
    directory.mkdir(exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: edits are rare and human-paced; the atomic write still protects readers
        yield
        return
    with open(directory / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _process_alive(document: dict[str, Any]) -> bool:
    """False only when the run's process is known to be gone (same host, no such pid)."""
    pid = document.get("pid")
    if not isinstance(pid, int) or document.get("hostname") != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _read_line(connection: socket.socket, limit: int = 65536) -> bytes:
    data = b""
    while b"\n" not in data and len(data) < limit:
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]
