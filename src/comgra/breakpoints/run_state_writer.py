"""The training process's run state (live/run.json) written in order, the periodic "running" one off the training thread.

Rank 0 writes "running" with its step every ``poll_interval_s`` (0.5 s): creating, writing and renaming a file took
1.2 ms of the MLP's training thread each time (benchmarks/unrecorded_step.py: about 9 us of every unrecorded step
on average, in hiccups of 1.5 ms). ``soon`` hands that write to one thread of this process and returns; ``now``
writes at once, for the states that must land (paused with its port and token, finished, a notice), and a write
queued before it is then dropped, so that an older "running" never replaces them.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable

_NUMBERS_LOCK = threading.Lock()  # guards _numbers and _pending (held for a few dictionary operations)
_WRITE_LOCK = threading.Lock()  # one write of a run state at a time, checked against the latest number
_numbers: dict[str, int] = {}  # per trial folder: the number of the latest state asked for
_pending: dict[str, tuple[int, Callable[[], None], Callable[[BaseException], None]]] = {}
_wake = threading.Event()
_thread: dict[str, threading.Thread | int | None] = {"thread": None, "pid": None}


def _next(key: str) -> int:
    """Under _NUMBERS_LOCK: the number of a new state of ``key``."""
    number = _numbers[key] = _numbers.get(key, 0) + 1
    return number


def now(key: str, write: Callable[[], None]) -> None:
    """``write()`` on this thread, after any write of ``key`` in progress; one queued before is dropped."""
    with _NUMBERS_LOCK:
        _next(key)
    with _WRITE_LOCK:
        write()


def soon(key: str, write: Callable[[], None], on_error: Callable[[BaseException], None]) -> None:
    """``write()`` on the run-state thread (the latest of ``key`` only), unless ``now`` writes ``key`` first;
    ``on_error(error)`` there where it raises."""
    with _NUMBERS_LOCK:  # numbered and queued at once: two calls of ``soon`` never queue the older one last
        _pending[key] = (_next(key), write, on_error)
    thread = _thread["thread"]
    if thread is None or _thread["pid"] != os.getpid():  # a forked child starts its own
        thread = threading.Thread(target=_run, name="comgra-run-state", daemon=True)
        _thread.update(thread=thread, pid=os.getpid())
        thread.start()
    _wake.set()


def _run() -> None:
    while True:
        _wake.wait()
        _wake.clear()
        with _NUMBERS_LOCK:
            work = list(_pending.items())
            _pending.clear()
        for key, (number, write, on_error) in work:
            with _WRITE_LOCK:
                if _numbers.get(key) != number:
                    continue  # a later state was asked for (and written by ``now``, or queued again)
                try:
                    write()
                except Exception as error:  # noqa: BLE001 - told to its owner; this thread serves the others
                    on_error(error)
