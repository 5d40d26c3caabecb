"""Mirror a local recording folder to a URL in the background: what a recorder with a URL root runs.

The training thread never touches the network. The durable local writer (``store.writer``) writes into a spool
folder on node-local disk; this uploader, on its own thread, sends each closed file under the same relative
key. It knows nothing of the layout, only three rules that every layout of comgra keeps:

- files are written under a temporary name and renamed (dot files are never uploaded, nor ``live/``, the
  node-local control state that holds a paused run's token);
- a steps chunk (a file below a folder named ``steps``) is the commit record of its training steps: it is sent
  only after every other file the same pass found is uploaded, and the steps folders are listed before the
  others, so a step in the remote index always has its data (a PUT is atomic);
- a file that disappears locally was merged into another: it is deleted remotely after the pass has uploaded
  what replaced it.

A journal (one line per claim, upload and delete, appended; in the spool's ``.comgra-upload/``; rewritten with the
last line of each file that still matters once most of its lines are history, ``Journal.compact``) makes this
survive crashes and share a spool with other processes on the node (the ranks of a multi-GPU node, the trials of
a sweep): a file recorded as uploaded with the same size and mtime is not sent again, a file another living
process has claimed is left to it, and a file uploaded by a process that died before it deleted the file's
remote copy is deleted by the next uploader of that spool (the next run of the trial, or ``comgra sync``). Every
node writes only keys of its own files, so ranks on many nodes need no coordination.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from comgra.store.filesystems import Location
from comgra.store.upload_journal import COMPACT_AT_LINES, JOURNAL_DIR, Journal, _alive

__all__ = ["COMMIT_FOLDER", "COMPACT_AT_LINES", "JOURNAL_DIR", "Journal", "PassResult", "Uploader", "is_commit",
           "local_files", "lower_priority", "on_threads"]

log = logging.getLogger("comgra.store")

COMMIT_FOLDER = "steps"
# A chunk as the writer first writes it (merge level 0: no "-l<level>"), which a merge replaces after some flushes.
_FRESH_CHUNK = re.compile(r"\d+-\d+-r\d+-\d+\.parquet")


@dataclass
class PassResult:
    uploaded: int = 0
    deleted: int = 0
    bytes: int = 0
    pending: int = 0  # files still to upload after this pass (failed, claimed elsewhere, or deferred steps)
    pending_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    deferred: int = 0  # fresh chunks younger than ``delay`` left for a later pass (not pending: nothing failed)
    due: float | None = None  # time.time() when the oldest of them is due


def local_files(folder: Path, within: list[str] | None = None) -> dict[str, tuple[int, int]]:
    """The files to mirror below ``folder``: relative POSIX path -> (size, mtime_ns); the steps folders first.
    ``within``: only below these relative folders (None: all of ``folder``).

    ``os.scandir`` with plain string keys: the type of each entry comes with the listing and its size and time
    from one ``lstat``, so that a pass of the uploader holds the GIL as little as it can (no ``pathlib``)."""
    found: list[dict[str, tuple[int, int]]] = [{}, {}]  # the other files, the steps chunks
    base = os.fspath(folder)
    prefixes = [""] if within is None else [_prefix(relative) for relative in within]
    for wanted in (True, False):  # listed in two walks: a steps chunk seen here has its data seen by the second
        for prefix in prefixes:
            _scan(base, prefix, COMMIT_FOLDER in prefix.split("/"), wanted, found[wanted])
    return {**found[False], **found[True]}


def _prefix(relative: str) -> str:
    relative = relative.strip("/")
    return "" if relative in ("", ".") else f"{relative}/"


def _scan(base: str, prefix: str, is_steps: bool, wanted: bool, out: dict[str, tuple[int, int]]) -> None:
    """The files of ``base/prefix`` (a relative folder ending in "/", or "") and below into ``out``: those below a
    steps folder when ``wanted``, the others when not. Never a dot file or folder, nor ``live/``, nor a link."""
    try:
        entries = list(os.scandir(os.path.join(base, prefix) if prefix else base))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                if name != "live":
                    _scan(base, f"{prefix}{name}/", is_steps or name == COMMIT_FOLDER, wanted, out)
            elif is_steps == wanted and entry.is_file(follow_symlinks=False):
                status = entry.stat(follow_symlinks=False)
                out[prefix + name] = (status.st_size, status.st_mtime_ns)
        except FileNotFoundError:
            continue


def lower_priority(niceness: int = 10) -> None:
    """Lower the OS priority of the calling thread (Linux: each thread has a nice value of its own), so that the
    uploader yields the CPU to the training whenever both want it. Never call it from a thread the user owns (a
    lowered priority cannot be raised again without privileges); elsewhere, or when refused, nothing happens."""
    if not (sys.platform.startswith("linux") and hasattr(os, "setpriority")):
        return
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + niceness))
    except OSError:
        pass


def on_threads(work: Callable[[], None], count: int, name: str, *, low_priority: bool = False) -> None:
    """Run ``work`` on ``count`` threads at once (this one among them) and return when all are done; with
    ``low_priority`` the helper threads run at a lowered OS priority (``lower_priority``).

    Short-lived threads, not a pool: finalize may run in an ``atexit`` handler, after Python has shut the pools of
    ``concurrent.futures`` down."""
    def lowered() -> None:
        if low_priority:
            lower_priority()
        work()

    helpers = [threading.Thread(target=lowered, name=name, daemon=True) for _ in range(count - 1)]
    for helper in helpers:
        helper.start()
    work()
    for helper in helpers:
        helper.join()


def is_commit(key: str) -> bool:
    return COMMIT_FOLDER in key.split("/")[:-1]


class Uploader:
    """Uploads ``local`` (a folder) to ``remote`` in passes, on a thread of its own (``start``) or at once (``run_pass``).

    ``journal_root`` is the folder whose ``.comgra-upload/`` holds the journal (the spool root). ``limit_bytes``
    bounds what may wait for upload: past it ``full`` is set (the recorder then stops recording, once, with a
    message) until the backlog drains.

    The thread costs the training as little as it can: it runs at a lowered OS priority, it sleeps until ``wake``
    (the recorder's writer calls it after each flush) or ``idle_interval`` seconds have passed, and it waits
    ``interval`` seconds after a wake before its pass, so that what the writer publishes meanwhile goes in the same
    pass (at most one pass per ``interval``). A file goes up as one copy in Arrow's C++ code, without the GIL.

    ``scope`` (a function returning folders relative to ``local``) narrows the passes after the first full one to
    those folders: a recorder's uploader walks its own trial's folders, not every trial of a spool that a sweep
    filled, so that a pass costs the same at the thousandth trial as at the first. The first pass, and those of
    ``comgra sync``, walk the whole folder (what crashed runs left).

    ``delay``: the thread's passes (while the training runs) send a fresh chunk (merge level 0) only once it is that
    many seconds old. The writer merges every few flushes' chunks into one, so most fresh chunks are replaced before
    they are due, and each of them would have cost a PUT and, once merged away, a remote delete (three requests with
    Arrow's S3 filesystem). The bucket then lags the spool by at most ``delay`` seconds (and a pass); a steps chunk
    waits as long as the data it commits (it is written after them), so the order holds. ``finish`` and ``run_pass``
    called from elsewhere (``comgra sync``) send everything at once."""

    def __init__(self, local: Path, remote: Location, *, journal_root: Path | None = None, interval: float = 1.0,
                 limit_bytes: int | None = None, workers: int = 4, max_attempts: int = 3,
                 idle_interval: float = 30.0, scope: Callable[[], list[str]] | None = None, delay: float = 0.0):
        self.local = local
        self.delay = delay
        self.remote = remote
        self.journal = Journal(journal_root or local, remote.url)
        self.interval = interval
        self.idle_interval = idle_interval
        self.scope = scope
        self._walked_all = False  # a pass has walked the whole folder (later ones may keep to ``scope``)
        self.limit_bytes = limit_bytes
        self.workers = workers
        self.max_attempts = max_attempts
        self.full = False
        self.last = PassResult()
        self.total = PassResult()
        self.failures = 0  # passes in a row that ended with an error
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._deadline: float | None = None
        self._pass_lock = threading.Lock()

    # -- the thread ------------------------------------------------------------------------------
    def start(self) -> Uploader:
        self._thread = threading.Thread(target=self._loop, name="comgra-uploader", daemon=True)
        self._wake.set()  # a first pass at once: what an earlier run of this spool left, and the new trial.json
        self._thread.start()
        return self

    def wake(self) -> None:
        """New files are in the folder (the writer published a flush): a pass within ``interval`` seconds."""
        self._wake.set()

    def _loop(self) -> None:
        lower_priority()
        retry_at: float | None = None  # while the store fails, files wait, or fresh chunks are not due: the next pass
        measure = False  # while the store fails (or others hold files): the backlog is measured on each wake
        while not self._stop.is_set():
            timeout = self.idle_interval if retry_at is None else max(0.0, retry_at - time.monotonic())
            woken = self._wake.wait(timeout)
            if self._stop.is_set():
                return  # finish() runs the last passes
            self._wake.clear()
            if retry_at is not None and time.monotonic() < retry_at:
                if measure:
                    self.measure_backlog()  # the spool keeps growing while the store is away: the limit holds meanwhile
                continue
            if woken and self._stop.wait(self.interval):
                return  # a batch: what the writer publishes in the next moment goes up in the same pass
            self._wake.clear()
            result = self.run_pass()
            measure = bool(self.failures or result.pending)
            # Backoff while the store fails: 2, 4, ... 30 s between passes (each pass retries each request too).
            if self.failures:
                retry_at = time.monotonic() + min(30.0, self.interval * 2 ** min(self.failures, 5))
            elif result.pending:
                retry_at = time.monotonic() + 2 * self.interval
            elif result.due is not None:  # the oldest fresh chunk left for later, once it is due
                retry_at = time.monotonic() + max(self.interval, result.due - time.time())
            else:
                retry_at = None

    def measure_backlog(self) -> int:
        """Bytes of the spool not uploaded yet (a local listing, no network); sets ``full``."""
        self.journal.read_new()
        waiting = 0
        for key, (size, mtime) in self._local_files()[1].items():
            entry = self.journal.entries.get(key)
            if entry is None or entry.op != "U" or (entry.size, entry.mtime) != (size, mtime):
                waiting += size
        if self.limit_bytes is not None:
            self.full = waiting > self.limit_bytes
        return waiting

    def finish(self, timeout: float) -> PassResult:
        """Upload what is left (passes until nothing is pending, or ``timeout`` seconds), then stop the thread."""
        deadline = time.monotonic() + timeout
        self._deadline = deadline  # retries inside a pass stop there too
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        result = self.run_pass()
        delay = 0.2
        while (result.pending or result.errors) and time.monotonic() + delay < deadline:
            time.sleep(delay)
            delay = min(5.0, delay * 2)
            result = self.run_pass()
        return result

    # -- one pass ----------------------------------------------------------------------------------
    def run_pass(self) -> PassResult:
        with self._pass_lock:
            result = PassResult()
            try:
                self._pass(result)
            except Exception as error:  # noqa: BLE001 - the store is down or refused: the next pass retries
                result.errors.append(f"{type(error).__name__}: {error}")
            self.failures = self.failures + 1 if result.errors else 0
            self.last = result
            self.total.uploaded += result.uploaded
            self.total.deleted += result.deleted
            self.total.bytes += result.bytes
            if self.limit_bytes is not None:
                self.full = result.pending_bytes > self.limit_bytes
            return result

    def _local_files(self) -> tuple[list[str] | None, dict[str, tuple[int, int]]]:
        """(the folders walked, None for all; the files found there)."""
        if not self.local.is_dir():
            return None, {}
        within = self.scope() if self.scope is not None and self._walked_all else None
        return within, local_files(self.local, within)

    def _pass(self, result: PassResult) -> None:
        self.journal.read_new()
        within, present = self._local_files()
        todo: list[tuple[str, int, int]] = []
        for key, (size, mtime) in present.items():
            entry = self.journal.entries.get(key)
            if entry is not None and (entry.size, entry.mtime) == (size, mtime):
                if entry.op == "U":
                    continue
                if entry.op == "P" and entry.pid != os.getpid() and _alive(entry.pid):
                    result.pending += 1  # another process of this node sends it
                    result.pending_bytes += size
                    continue
            todo.append((key, size, mtime))
        if self.limit_bytes is not None:  # what waits now, before this pass sends anything
            self.full = sum(size for _, size, _ in todo) + result.pending_bytes > self.limit_bytes
        if self.delay > 0 and self._thread is not None and threading.current_thread() is self._thread:
            todo = self._due(todo, result)
        data = [item for item in todo if not is_commit(item[0])]
        commits = [item for item in todo if is_commit(item[0])]
        self._send(data, result)
        if result.pending or result.errors or any(not (self.local / key).exists() for key, _, _ in data):
            # A data file was merged away under this pass, or is not sent yet: the steps chunks wait for the next one.
            result.pending += len(commits)
            result.pending_bytes += sum(size for _, size, _ in commits)
        else:
            self._send(commits, result)
        if result.errors:
            return
        self._walked_all = self._walked_all or within is None
        prefixes = None if within is None else tuple(f"{folder.rstrip('/')}/" for folder in within)
        # Sent by this process or by one that died (before it deleted them remotely), and gone here: merged into
        # a chunk this pass or an earlier one uploaded. Those of a living process of this node are its own to delete.
        # Only a file whose folder is still there went by a merge: a spool (or a trial in it) that someone deleted
        # deletes nothing in the store.
        gone = [key for key, entry in list(self.journal.entries.items())
                if entry.op in "PU" and key not in present and (prefixes is None or key.startswith(prefixes))
                and (entry.pid == os.getpid() or not _alive(entry.pid))
                and not (self.local / key).exists() and (self.local / key).parent.is_dir()]
        for key in gone:
            self._with_retries(lambda key=key: self.remote.delete(key))
            self.journal.append("D", key)
            result.deleted += 1
        # Rewritten once most of its lines are history (claims since uploaded, deletes done): one line per file.
        if self.journal.lines > max(COMPACT_AT_LINES, 4 * sum(e.op != "D" for e in self.journal.entries.values())):
            self.journal.compact(lambda key, entry: entry.op != "D")

    def _due(self, todo: list[tuple[str, int, int]], result: PassResult) -> list[tuple[str, int, int]]:
        """``todo`` less the fresh chunks younger than ``delay`` (counted in ``result.deferred``, ``result.due``)."""
        cutoff = time.time_ns() - int(self.delay * 1e9)
        due: list[tuple[str, int, int]] = []
        for item in todo:
            if item[2] > cutoff and _FRESH_CHUNK.fullmatch(item[0].rsplit("/", 1)[-1]):
                result.deferred += 1
                ready = item[2] / 1e9 + self.delay
                result.due = ready if result.due is None else min(result.due, ready)
            else:
                due.append(item)
        return due

    def _send(self, items: list[tuple[str, int, int]], result: PassResult) -> None:
        """Claim ``items`` (one journal write), upload them, journal them as uploaded (one write per thread).

        On the uploader's own thread (while the training runs) on that one thread: no helper threads to start and
        none contending for the GIL with the training; elsewhere (``finish``, ``comgra sync``) on ``workers``."""
        if not items:
            return
        # Claimed before the PUTs (a crash leaves claims of a process that died, which the next uploader sends again),
        # in one step with reading what other processes of the node claimed or uploaded since the pass began.
        queue = self.journal.claim(items, self._claimed_elsewhere)
        chosen = set(queue)
        for key, size, mtime in items:
            if (key, size, mtime) not in chosen:
                result.pending += 1
                result.pending_bytes += size
        queue.reverse()  # popped from the end: in the order of ``items``
        lock = threading.Lock()

        def work() -> None:
            done: list[tuple[str, int, int]] = []
            try:
                while True:
                    with lock:
                        if not queue or result.errors:
                            return
                        key, size, mtime = queue.pop()
                    try:
                        self._with_retries(lambda key=key: self.remote.upload(self.local / key, key))
                        done.append((key, size, mtime))
                        with lock:
                            result.uploaded += 1
                            result.bytes += size
                    except FileNotFoundError:
                        pass  # merged away meanwhile: its successor is uploaded instead, its claim deleted remotely
                    except Exception as error:  # noqa: BLE001 - counted as pending, retried on the next pass
                        with lock:
                            result.errors.append(f"{key}: {type(error).__name__}: {error}")
                            result.pending += 1
                            result.pending_bytes += size
            finally:
                self.journal.append_many("U", done)

        own_thread = threading.current_thread() is self._thread
        on_threads(work, 1 if own_thread else min(self.workers, len(queue)), "comgra-upload", low_priority=own_thread)
        with lock:
            for key, size, _ in queue:  # left after an error
                result.pending += 1
                result.pending_bytes += size

    def _claimed_elsewhere(self, key: str, size: int, mtime: int) -> bool:
        """Whether another living process of this node claimed or uploaded this version of the file (journal lines
        read since the pass began), so that two uploaders of one spool rarely send a file twice."""
        entry = self.journal.entries.get(key)
        return entry is not None and (entry.size, entry.mtime) == (size, mtime) and entry.pid != os.getpid() \
            and (entry.op == "U" or entry.op == "P" and _alive(entry.pid))

    def _with_retries(self, action: object) -> None:
        delay = 0.2
        for attempt in range(self.max_attempts):
            try:
                action()  # type: ignore[operator]
                return
            except FileNotFoundError:
                raise
            except OSError:
                late = self._deadline is not None and time.monotonic() + delay > self._deadline
                if attempt == self.max_attempts - 1 or late:
                    raise
                time.sleep(delay)
                delay = min(8.0, delay * 2)
