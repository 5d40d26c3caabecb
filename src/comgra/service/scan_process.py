"""The background findings scan of ``comgra``'s own server, in a child process (issue 31 item 13).

A scan reads the whole trial it scans (up to ``comgra.analysis.loading.IN_MEMORY_ROWS`` rows; past that it streams),
so its peak grows with a live run, and the allocators of the process it ran in kept what it freed: the served
process's RSS followed the run (20 REST clients, 10 minutes: +2.8 MiB per minute with the scan against +1.9
without, benchmarks/server_hours.py). Here the scan runs in a child process (``ProcessPoolExecutor``, spawned,
one worker): what a scan holds is that process's, and goes back to the system when it ends. The child keeps
the chunks it read for the next scan of a live trial (only new chunks are read then), and is replaced after
``SCANS_PER_PROCESS`` scans, so what its allocators keep is bounded too; ``IDLE_SECONDS`` after the last scan it
ends. The server itself then never imports the detectors' libraries (scipy, scikit-learn).

The child saves what it found in the recording (``Scanner(persist=True)``), as ``comgra scan`` does, and
returns it. User detectors registered in the server (comgra.toml's ``[anomalies] detectors``, entry points) are
registered again in the child by module and name. A child that dies (killed, out of memory) is reported as
the trial's problem, and the next scan starts a fresh one.
"""
from __future__ import annotations

import atexit
import importlib
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from comgra.store.arrow_pool import start_child

if TYPE_CHECKING:
    from comgra.analysis.findings import Finding, ScanOptions

SCANS_PER_PROCESS = 20  # then a fresh child: what its allocators kept of the chunks it read goes with it
WATCH_PARENT_S = 0.5  # how often the child looks whether the server still runs
IDLE_SECONDS = 30.0  # a child with nothing to scan for this long ends (spawning one costs about 2 s of CPU)
NICENESS = 10  # the child's scheduling priority below the server's: a click's answer is not slowed by a scan


def importable_detectors() -> list[tuple[str, str, str]] | None:
    """(name, module, qualified name) of each registered user detector, or None if one cannot be imported by
    name in another process (defined in ``__main__`` or inside a function): then the scan stays in-process."""
    from comgra.analysis.custom import registered

    found = []
    for name, function in registered().items():
        module, qualified = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
        if not module or module == "__main__" or "<locals>" in qualified:
            return None
        found.append((name, module, qualified))
    return found


class ScanProcess:
    """One child process at a time that scans trials of one group folder. Thread-safe."""

    def __init__(self, path: str, detectors: list[tuple[str, str, str]]) -> None:
        self.path = path
        self.detectors = detectors
        self.started = 0  # children started so far
        self._pool: ProcessPoolExecutor | None = None
        self._idle: threading.Timer | None = None
        self._lock = threading.Lock()

    def scan(self, trial_id: str, options: ScanOptions) -> tuple[list[Finding], list[str]]:
        """Findings and problems of one trial, scanned in the child (raises what the scan raised there)."""
        with self._lock:
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None
            if self._pool is None:
                self._pool = child_pool()
                if not self.started:  # before multiprocessing's own exit handler, which would wait for the child
                    atexit.register(self.close)
                self.started += 1
            pool = self._pool
        try:
            return pool.submit(scan_here, self.path, trial_id, options, self.detectors).result()
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            return [], [(f"trial {trial_id!r}: the findings scan's process ended before it was done (out of memory?); "
                         "it is scanned again when its data changes")]
        finally:
            with self._lock:
                if self._pool is pool and self._idle is None:
                    self._idle = threading.Timer(IDLE_SECONDS, self._end_if_idle, (pool,))
                    self._idle.daemon = True
                    self._idle.start()

    def _end_if_idle(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is not pool:
                return
            self._pool, self._idle = None, None
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None
        if pool is not None:
            children = list((getattr(pool, "_processes", None) or {}).values())  # shutdown forgets them
            pool.shutdown(wait=False, cancel_futures=True)
            for process in children:  # a scan under way ends now; an idle child would be waited for at exit
                process.terminate()


def child_pool() -> ProcessPoolExecutor:
    """The scan's child: one spawned worker, replaced after ``SCANS_PER_PROCESS`` tasks, that ends with this
    process (``end_with_parent``) and takes Arrow's buffers from this process's pool, chosen before its pyarrow
    loads (``store.arrow_pool.start_child``)."""
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                               max_tasks_per_child=SCANS_PER_PROCESS, initializer=start_child,
                               initargs=(arrow_pool(), f"{__name__}:end_with_parent", os.getpid()))


def arrow_pool() -> str | None:
    """The name of Arrow's pool in this process where pyarrow is loaded (the server's: jemalloc), else None."""
    pyarrow = sys.modules.get("pyarrow")
    return str(pyarrow.default_memory_pool().backend_name) if pyarrow is not None else None


def end_with_parent(parent: int) -> None:
    """In the child: end as soon as the server has ended (Ctrl+C, killed): a worker of a ``ProcessPoolExecutor``
    whose parent is gone waits for work forever, holding the server's stdout open. The child also runs at a lower
    priority (``NICENESS``): on a machine whose cores are busy, the server's answers and the browser come first and
    the scan takes what is left (a scan is background work; its findings are marked as being refreshed meanwhile)."""
    try:
        os.nice(NICENESS)
    except OSError:  # not permitted here (a sandbox): the child runs at the server's priority
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_PARENT_S)
        os._exit(0)

    threading.Thread(target=watch, name="comgra-scan-parent", daemon=True).start()


_CHILD: dict[str, Any] = {}  # in the child: its scanner and group readers, kept from one scan to the next


def scan_here(path: str, trial_id: str, options: ScanOptions,
              detectors: list[tuple[str, str, str]]) -> tuple[list[Finding], list[str]]:
    """In the child: scan ``trial_id`` of the group folder ``path`` and save its findings in the recording."""
    from comgra.analysis.custom import register_detector
    from comgra.analysis.scan import Scanner
    from comgra.store.reader import GroupReader

    for name, module, qualified in detectors:
        function: Any = importlib.import_module(module)
        for part in qualified.split("."):
            function = getattr(function, part)
        register_detector(name, function, replace=True)
    scanner = _CHILD.setdefault("scanner", Scanner(persist=True))
    group = _CHILD.get(path)
    if group is None:
        group = _CHILD[path] = GroupReader(path)
    return scanner.scan_and_release(group, trial_id, options)
