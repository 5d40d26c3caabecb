"""The app's background reads: one thread that reads the steps around the shown one ahead of the step
buttons, and one thread, at a lower CPU priority, for the reads that scan a whole trial (a tensor's
series over every step), which no click waits for. Used by ``steps.StepReads``.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from comgra.store.series_read import ReadCancelled

_log = logging.getLogger("comgra.service")

class Prefetcher:
    """One background thread that runs the latest request it was given; older ones that have not started
    are dropped (the user has moved on). A failure is logged, never raised: a prefetch is an extra."""

    def __init__(self, run: Any):
        self._run = run
        self._latest: Any = None
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="comgra-prefetch", daemon=True)
        self._thread.start()

    def ask(self, request: Any) -> None:
        with self._wake:
            self._latest = request
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(5)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while self._latest is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                request, self._latest = self._latest, None
            try:
                self._run(request)
            except Exception:  # noqa: BLE001 - the step is read when it is asked for, and fails visibly then
                _log.debug("comgra: reading steps ahead failed", exc_info=True)


# -- reads that a click never waits for (issue 7) ------------------------------------------------------
LOW_PRIORITY_NICE = 5  # added to the niceness of the thread that reads whole trials (Linux only)


class ReadSuperseded(Exception):
    """A whole-trial read that had not started when a newer one was asked for: the user has moved on
    (the app keeps what it shows; see ``LowPriorityReads``)."""


class LowPriorityReads:
    """One thread, at a lower CPU priority, for the reads that scan every chunk of a trial (the series
    plot of a newly selected tensor: seconds at 50x).

    Such a read ran beside the next click's values, on the same two cores, and made that click wait
    up to a second; at a lower priority the click's few milliseconds of work go first. Only reads that
    no click waits for come here (a click that waited on a low-priority read would wait longer).
    A read still waiting for the thread when a newer one is asked for is dropped (``ReadSuperseded``):
    clicking through nodes faster than their series are read queued one read per click, each holding one
    of the browser's six connections to the app, until the values of a click waited for a free one.
    A running read is told so too (``read(cancelled)``: ``cancelled()`` turns true) and ends at its next
    chunk: at 1,000 nodes x 50x steps a series takes seconds, and clicks a second apart kept this thread
    busy with plots nobody would see.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="comgra-whole-trial-read",
                                        initializer=_lower_this_threads_priority)
        self._worker_ids: set[int] = set()
        self._waiting: list[Future[pa.Table]] = []
        self._asked = 0  # reads asked so far: a read whose number is not the last one is superseded
        self._lock = threading.Lock()

    def run(self, read: Callable[[Callable[[], bool]], pa.Table]) -> pa.Table:
        """``read(cancelled)`` on the thread; ``cancelled()`` is true once a newer read was asked for."""
        if threading.get_ident() in self._worker_ids:  # asked from the worker itself: no deadlock
            return read(_never)
        with self._lock:
            for older in self._waiting:
                older.cancel()  # one that has not started; a running one sees cancelled() and stops
            self._asked += 1
            number = self._asked
            future = self._pool.submit(self._tracked, read, lambda: self._asked != number)
            self._waiting = [future]
        try:
            return future.result()
        except CancelledError:
            raise ReadSuperseded("a newer read was asked for before this one started") from None
        except ReadCancelled:
            raise ReadSuperseded("a newer read was asked for while this one ran") from None

    @property
    def asked(self) -> int:
        """How many reads were asked so far (a read asked later supersedes the ones under way)."""
        return self._asked

    def _tracked(self, read: Callable[[Callable[[], bool]], pa.Table], cancelled: Callable[[], bool]) -> pa.Table:
        self._worker_ids.add(threading.get_ident())
        return read(cancelled)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _never() -> bool:
    return False


def _lower_this_threads_priority() -> None:
    """Make the calling thread yield the CPU to the app's other threads (Linux: threads have their own
    niceness). Elsewhere a thread's priority cannot be lowered alone, and nothing changes."""
    if sys.platform.startswith("linux"):
        try:
            thread = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + LOW_PRIORITY_NICE))
        except OSError:  # a sandbox that forbids it: the read runs at the usual priority
            _log.debug("comgra: could not lower the priority of the whole-trial reads", exc_info=True)
