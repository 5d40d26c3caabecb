"""Breakpoints and run control of a trial, through files under ``<trial_dir>/live/`` and a local socket.

No torch here: the app and the REST API (separate processes, maybe without torch) call these functions; the training
process (``comgra.breakpoints.monitor``) reads the same files.

- ``breakpoints.json``: the breakpoints, written atomically under a lock by whoever edits them.
- ``run.json``: the training process's state (``running``, ``paused``, ``finished``), the step, the
  breakpoint that paused it, hit counts, and the 127.0.0.1 port and random token on which a paused
  run accepts one command (``continue``, ``step`` or ``abort``).

What holds against other users of the machine and against a hostile recording: ``live/`` is created 0700 and every
file in it 0600 from the start (an existing ``live/`` open to others is closed); ``live/`` or a file in it that is a
link is never read or written through (``private_files``); a damaged ``breakpoints.json`` is a ``ComgraError``
naming it, never silently replaced. The paused run acts only on a well-formed line carrying its token (at most
``MAX_LINE_BYTES``, parsed only after that bound), serves many clients at once and drops one that is idle for
``CLIENT_TIMEOUT_S``; anything else leaves it paused. ``send_command`` connects only to 127.0.0.1, and only to a
port on which the process that published ``run.json`` listens, on this machine.

    >>> from comgra.breakpoints import control                                 # doctest: +SKIP
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
import selectors
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from comgra.errors import BreakpointError, ComgraError, NotPaused, StoreError, UnknownBreakpoint, did_you_mean
from comgra.breakpoints import peers, private_files, run_state_writer
from comgra.breakpoints.conditions import parse_condition

__all__ = ["ACTIONS", "add_breakpoint", "list_breakpoints", "remove_breakpoint", "run_state", "send_command",
           "update_breakpoint", "live_dir", "replace_breakpoints", "write_run_state", "read_run_document",
           "wait_for_command", "read_breakpoints", "breakpoints_signature", "checked_breakpoint"]

ACTIONS = ("continue", "step", "abort")
LIVE_DIR = "live"
BREAKPOINTS_FILE = "breakpoints.json"
RUN_FILE = "run.json"
MAX_TARGET_LENGTH = 300
COMMAND_TIMEOUT_S = 10.0  # how long send_command waits for the paused run's answer
CLIENT_TIMEOUT_S = 3.0  # a client of the paused run that has not sent its line by then is dropped
MAX_LINE_BYTES = 1024  # a command is about 80 bytes; nothing longer is parsed
MAX_CLIENTS = 32  # at once; beyond that the oldest client is dropped


def live_dir(trial_dir: str | Path) -> Path:
    return Path(trial_dir) / LIVE_DIR


# -- breakpoints -------------------------------------------------------------------------------------
def list_breakpoints(trial_dir: str | Path) -> list[dict[str, Any]]:
    """Every breakpoint of the trial with its hit count (hits are counted by the training process)."""
    hits = read_run_document(trial_dir).get("hits", {})
    return [{**entry, "hits": int(hits.get(entry["id"], 0))} for entry in _read_breakpoints(trial_dir)["breakpoints"]]


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

    A paused run also names the ``target``, ``condition`` and ``iteration`` of the breakpoint that paused it; a
    finished run its ``reason`` ("aborted" when an Abort ended it).

    "unknown": no run has published a state, or its process on this host is gone without finishing.
    """
    document = read_run_document(trial_dir)
    state = document.get("state", "unknown")
    if state in ("running", "paused") and not peers.process_alive(document):
        state = "unknown"
    from comgra.breakpoints.run_types import checked_run_state  # each field of its type, or named in problems

    return checked_run_state({"state": state, **{name: document.get(name) for name in _SHOWN},
                              "ranks": document.get("ranks", 1), "hits": dict(document.get("hits", {}))},
                             str(live_dir(trial_dir) / RUN_FILE))


_SHOWN = ("training_step", "breakpoint", "type_of_execution", "iteration", "target", "condition", "reason",
          "updated", "notice")


def send_command(trial_dir: str | Path, action: str) -> dict[str, Any]:
    """Tell a paused run to ``continue``, ``step`` (pause again at the next step) or ``abort``.

    Connects only to 127.0.0.1 and only to a port on which the process that published ``run.json``
    listens, on this machine: a recording from elsewhere cannot make it connect anywhere else.
    """
    if action not in ACTIONS:
        raise BreakpointError(f"action={action!r} is not a run command; use one of {list(ACTIONS)}.", field="action")
    document = read_run_document(trial_dir)
    if document.get("state") != "paused" or not peers.process_alive(document):
        raise NotPaused(f"The run of {str(trial_dir)!r} is not paused (state: {run_state(trial_dir)['state']!r}); "
                        f"{action!r} applies only to a run waiting at a breakpoint.")
    port, token = _checked_peer(trial_dir, document)
    message = json.dumps({"token": token, "action": action}).encode() + b"\n"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=COMMAND_TIMEOUT_S) as connection:
            connection.sendall(message)
            reply = _read_line(connection)
    except OSError as error:
        raise NotPaused(f"The paused run of {str(trial_dir)!r} did not answer on port {port} "
                        f"({error}); it may have resumed or ended. Check run_state().") from None
    try:
        answer = json.loads(reply or b"{}")
    except ValueError:
        answer = {"error": f"an answer that is not JSON: {reply[:60]!r}"}
    if not isinstance(answer, dict) or not answer.get("ok"):
        why = answer.get("error", "no answer") if isinstance(answer, dict) else answer
        raise ComgraError(f"The run refused {action!r}: {why}")
    return answer


def _checked_peer(trial_dir: str | Path, document: dict[str, Any]) -> tuple[int, str]:
    """(port, token) of the paused run that ``document`` names, or a ComgraError saying why comgra refuses it."""
    where = f"{str(live_dir(trial_dir) / RUN_FILE)!r}"
    port, token, pid, host = document.get("port"), document.get("token"), document.get("pid"), document.get("host")
    if not (isinstance(port, int) and 0 < port < 65536 and isinstance(token, str) and isinstance(pid, int)):
        raise NotPaused(f"{where} names no port, token and process of a paused run; it is damaged.")
    if document.get("hostname") != socket.gethostname():
        raise ComgraError(f"comgra refuses to send a command: {where} was written on another machine "
                          f"({str(document.get('hostname'))[:60]!r}); a paused run is controlled from its own machine.")
    if host is not None and not peers.is_loopback_address(host):
        raise ComgraError(f"comgra refuses to send a command to host {str(host)[:60]!r} named in {where}: "
                          "a paused run listens on 127.0.0.1 only.")
    if peers.listens_on(pid, port) is False:  # no one waits there: the run is not (or no longer) paused
        raise NotPaused(f"comgra refuses to send a command to port {port}: the process {pid} that {where} names "
                          "does not listen there (it may have resumed, or the file did not come from a run of "
                          "this machine).")
    return port, token


def read_run_document(trial_dir: str | Path) -> dict[str, Any]:
    """run.json as published; {} ("unknown") when there is none or it is damaged (never read through a link);
    hit counts that are not integers are left out, and a paused state without a usable token and port is none."""
    try:
        document = _parse(_read_private(trial_dir, RUN_FILE))
    except (OSError, ValueError, RecursionError, ComgraError):
        return {}
    if not isinstance(document, dict):
        return {}
    hits = document.get("hits", {})
    document["hits"] = {k: v for k, v in hits.items() if type(v) is int} if isinstance(hits, dict) else {}  # noqa: E721
    if document.get("state") == "paused" and not (isinstance(document.get("token"), str)
                                                  and type(document.get("port")) is int):  # noqa: E721
        document["state"] = "unknown"
    return document


def write_run_state(trial_dir: str | Path, document: dict[str, Any], *, on_error: Callable[[BaseException], None] |
                    None = None) -> None:
    """Publish the training process's state (atomic: readers never see half a file), in order with the others;
    ``on_error``: on another thread (breakpoints/run_state_writer.py), told there where the write fails."""
    full = {**document, "updated": time.time()}

    def write() -> None:
        _write_private(trial_dir, RUN_FILE, full)
    if on_error is None:
        run_state_writer.now(str(trial_dir), write)
    else:
        run_state_writer.soon(str(trial_dir), write, on_error)


def wait_for_command(trial_dir: str | Path, state: dict[str, Any], timeout: float | None) -> str:
    """Publish ``state`` as paused and block (no busy loop) until a valid command or ``timeout`` seconds.

    Listens on 127.0.0.1, an ephemeral port, for one line ``{"token", "action"}`` per connection, from
    any number of clients at once; a wrong token or a malformed line is answered with an error and
    changes nothing, and a client that has not sent its line within ``CLIENT_TIMEOUT_S`` is dropped.
    Returns the action, or "continue" when the timeout runs out.
    """
    token = secrets.token_hex(16)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server, selectors.DefaultSelector() as selector:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.setblocking(False)
        selector.register(server, selectors.EVENT_READ)
        write_run_state(trial_dir, {**state, "state": "paused", "host": "127.0.0.1", "port": server.getsockname()[1],
                                    "token": token})
        clients = _Clients(selector)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return "continue"
                clients.drop_idle(now)
                waits = [w for w in (clients.next_deadline(), deadline) if w is not None]
                for key, _ in selector.select(max(0.0, min(waits) - now) if waits else None):
                    if key.fileobj is server:
                        clients.accept(server)
                        continue
                    line = clients.read(key.fileobj)  # type: ignore[arg-type]
                    if line is None:
                        continue
                    action = _answer(key.fileobj, line, token,  # type: ignore[arg-type]
                                     lambda action: _resumed(trial_dir, state, action))
                    clients.close(key.fileobj)  # type: ignore[arg-type]
                    if action is not None:
                        return action
        finally:
            clients.close_all()


class _Clients:
    """The connections of a paused run: each gets one line of at most MAX_LINE_BYTES within CLIENT_TIMEOUT_S."""

    def __init__(self, selector: selectors.BaseSelector):
        self.selector = selector
        self.buffers: dict[socket.socket, bytearray] = {}
        self.deadlines: dict[socket.socket, float] = {}

    def accept(self, server: socket.socket) -> None:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        if len(self.buffers) >= MAX_CLIENTS:
            self.close(min(self.deadlines, key=self.deadlines.__getitem__))
        connection.setblocking(False)
        self.buffers[connection] = bytearray()
        self.deadlines[connection] = time.monotonic() + CLIENT_TIMEOUT_S
        self.selector.register(connection, selectors.EVENT_READ)

    def read(self, connection: socket.socket) -> bytes | None:
        """The client's line once it is complete (or the client ended), else None."""
        try:
            chunk = connection.recv(4096)
        except BlockingIOError:
            return None
        except OSError:
            chunk = b""
        buffer = self.buffers[connection]
        buffer += chunk
        line, newline, _ = bytes(buffer[:MAX_LINE_BYTES + 1]).partition(b"\n")
        return line if newline or not chunk or len(line) > MAX_LINE_BYTES else None

    def next_deadline(self) -> float | None:
        return min(self.deadlines.values(), default=None)

    def drop_idle(self, now: float) -> None:
        for connection in [c for c, deadline in self.deadlines.items() if deadline <= now]:
            self.close(connection)

    def close(self, connection: socket.socket) -> None:
        self.buffers.pop(connection, None)
        self.deadlines.pop(connection, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection)
        connection.close()

    def close_all(self) -> None:
        for connection in list(self.buffers):
            self.close(connection)


def _resumed(trial_dir: str | Path, state: dict[str, Any], action: str) -> None:
    """Before the sender gets its answer: the run is no longer paused, so that whoever sent the command
    (the app, the REST API) reads the new state at once (the training process publishes it again as it goes)."""
    resumed = {**state, "state": "finished", "reason": "aborted"} if action == "abort" else \
        {**state, "state": "running", "breakpoint": None, "reason": None}
    with contextlib.suppress(OSError, ComgraError):  # a full disk must not lose the command: published later
        write_run_state(trial_dir, resumed)


def _answer(connection: socket.socket, line: bytes, token: str, accepted: Callable[[str], None]) -> str | None:
    """Authenticate, then act: the action of a well-formed line with the right token, else None (and an error)."""
    action, error = _command_of(line, token)
    if action is None:
        _reply(connection, {"ok": False, "error": error})
        return None
    accepted(action)
    _reply(connection, {"ok": True, "action": action})
    return action


def _command_of(line: bytes, token: str) -> tuple[str | None, str]:
    """(action, "") for ``{"token": <the token>, "action": <an action>}``, else (None, why not)."""
    if not line or len(line) > MAX_LINE_BYTES:
        return None, f"not a command: send one line of at most {MAX_LINE_BYTES} bytes"
    try:
        request = json.loads(line)  # at most MAX_LINE_BYTES: too short to nest deep enough for a RecursionError
    except (ValueError, RecursionError):
        return None, "not a command: send one JSON line {\"token\", \"action\"}"
    given = request.get("token") if isinstance(request, dict) else None
    if not isinstance(given, str) or \
            not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("ascii")):
        return None, "wrong token"
    action = request.get("action")
    if action not in ACTIONS:
        return None, f"unknown action {str(action)[:40]!r}; use one of {list(ACTIONS)}"
    return str(action), ""


def _reply(connection: socket.socket, answer: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # small enough for the socket's buffer: never blocks
        connection.sendall(json.dumps(answer).encode() + b"\n")


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
    """breakpoints.json, checked entry by entry; a damaged file is a ComgraError that names it and says why."""
    path = live_dir(trial_dir) / BREAKPOINTS_FILE
    try:
        raw = _read_private(trial_dir, BREAKPOINTS_FILE)
    except FileNotFoundError:
        return {"next_id": 1, "breakpoints": []}
    except OSError as error:
        raise ComgraError(f"{str(path)!r} cannot be read ({error}); delete it to start without breakpoints.") from None
    try:
        return _checked_document(_parse(raw))
    except (ValueError, RecursionError, ComgraError) as error:
        reason = "nested too deep" if isinstance(error, RecursionError) else str(error)[:300]
        raise ComgraError(f"{str(path)!r} is damaged: {reason}. Fix it (each breakpoint "
                          "{\"id\", \"target\", \"condition\", \"enabled\"}) or delete it to start without "
                          "breakpoints.") from None


def _checked_document(document: object) -> dict[str, Any]:
    if not isinstance(document, dict) or not isinstance(document.get("breakpoints"), list):
        raise ComgraError("it is not an object with a list 'breakpoints'")
    next_id = document.get("next_id", 1)
    if not isinstance(next_id, int) or isinstance(next_id, bool) or not 0 < next_id < 2**31:
        raise ComgraError(f"next_id={str(next_id)[:40]!r} is not a positive whole number")
    entries = []
    for entry in document["breakpoints"]:
        identifier = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(identifier, str) or not 0 < len(identifier) <= 100:
            raise ComgraError(f"the breakpoint {str(entry)[:80]} has no id (a string such as 'bp1')")
        entries.append({"id": identifier, **checked_breakpoint({k: v for k, v in entry.items() if k != "id"})})
    ids = [entry["id"] for entry in entries]
    if len(set(ids)) != len(ids):
        raise ComgraError(f"two breakpoints share an id: {sorted(i for i in set(ids) if ids.count(i) > 1)[:5]}")
    return {"next_id": next_id, "breakpoints": entries}


def _parse(raw: bytes) -> Any:
    return json.loads(raw.decode("utf-8"))


def _write_breakpoints(trial_dir: str | Path, document: dict[str, Any]) -> None:
    _write_private(trial_dir, BREAKPOINTS_FILE, document)


@contextlib.contextmanager
def _locked(trial_dir: str | Path) -> Iterator[None]:
    """Serialise read-modify-write of breakpoints.json between the app, the API and the trainer."""
    if not Path(trial_dir).is_dir():
        raise StoreError(f"No trial folder {str(trial_dir)!r}; breakpoints belong to a trial that a recorder created.")
    with private_files.locked(live_dir(trial_dir)):
        yield


def _read_private(trial_dir: str | Path, name: str) -> bytes:
    return private_files.read(live_dir(trial_dir), name)


def _write_private(trial_dir: str | Path, name: str, document: dict[str, Any]) -> None:
    private_files.write(live_dir(trial_dir), name, document)


def _read_line(connection: socket.socket, limit: int = 65536) -> bytes:
    data = b""
    while b"\n" not in data and len(data) < limit:
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]
