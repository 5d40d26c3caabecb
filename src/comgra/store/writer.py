"""A background thread that turns queued rows into immutable Parquet chunks.

The training thread only enqueues Arrow tables; compression and disk I/O
happen here. A fault on this thread (a full disk, a folder that is not
writable, a trial folder removed under the run) is kept in ``error`` and
reported by the recorder; it never raises into the training loop, and after it
nothing more is written.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from comgra.errors import StoreError
from comgra.store import format as fmt
from comgra.store import layout
from comgra.store.compaction import compact_folder
from comgra.store.encoding import (FRESH_COMPRESSION, MERGED_COMPRESSION, _encode, _encode_temporary,  # noqa: F401
                                   _read_part, _sorted, _tensor_order, _write_chunk, write_flushed_chunk)
from comgra.store.repair import repair_trial


class TrialFolderGone(StoreError):
    """The trial folder was removed or replaced while a run was recording into it."""


_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)


# At most this many bytes (the caller's estimate of what each holds) wait in put_later calls; beyond, the caller
# builds its tables itself.
LATER_BYTES = 32 << 20

# At close, each table of the writer's rank becomes one file (store/compaction.py). Tools and tests that want the
# chunks a run leaves without it (one per flush, merged in tiers) pass compact_at_close=False or turn this off.
COMPACT_AT_CLOSE = True


@dataclass(frozen=True)
class _Staged:
    """A chunk written under its temporary name, not yet renamed into place."""

    name: str  # the table
    path: Path  # its final name
    temporary: Path


@dataclass
class _Buffer:
    tables: dict[str, list[pa.Table]] = field(default_factory=lambda: {name: [] for name in fmt.TABLES})
    # JSON documents by path (the latest of each): written with the next chunks, in the same waits on the disk.
    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: int = 0
    bytes: int = 0
    since: float | None = None

    def add(self, name: str, table: pa.Table) -> None:
        self.tables[name].append(table)
        self.rows += table.num_rows
        # The buffers' sizes, not ``nbytes``: that one works out the part of each buffer the table references, 10 to
        # 30 times the cost (75 us for a 3,800-row tensors chunk), on the writer's thread, holding the GIL. They
        # differ only for a slice of a larger buffer, which this counts whole: the bound is then met sooner.
        self.bytes += table.get_total_buffer_size()
        self._started()

    def add_document(self, relative_path: str, document: dict[str, Any]) -> None:
        self.documents.pop(relative_path, None)  # a rewritten document goes where its latest version was queued
        self.documents[relative_path] = document
        self._started()

    def empty(self) -> bool:
        return not self.documents and not any(self.tables.values())

    def _started(self) -> None:
        if self.since is None:
            self.since = time.monotonic()


class ChunkWriter:
    """Writes the chunks of one trial.

    ``flush_seconds`` bounds how stale a live view can be at the start of a run. The interval
    then grows with the run's age (a sixteenth of it, at most ``max_flush_seconds``), so that a
    long run leaves tens of chunks rather than thousands: a query across all steps pays per chunk.

    What waits for the next flush is held in memory, so the buffer is also written once it holds
    ``max_buffered_rows`` rows or ``max_buffered_bytes`` bytes of Arrow data (None: no bound). Without the
    bytes bound the buffer grew with the interval through the run's first eight minutes (a steady slope of
    RSS over a long run: benchmarks/long_run_controls.py) and, for a model whose recorded steps take
    megabytes, held up to 30 s of them. Compaction keeps the extra chunks few.
    """

    def __init__(
        self,
        trial_dir: Path,
        *,
        flush_seconds: float = 2.0,
        max_flush_seconds: float = 30.0,
        max_buffered_rows: int = 100_000,
        max_buffered_bytes: int | None = 1 << 20,
        max_queued_items: int = 256,
        rank: int = 0,
        merge_every: int = 16,
        max_merged_rows: int = 1_000_000,
        compact_at_close: bool | None = None,
    ):
        self.trial_dir = trial_dir
        self.flush_seconds = flush_seconds
        self.max_flush_seconds = max(flush_seconds, max_flush_seconds)
        self._started = time.monotonic()
        self.max_buffered_rows = max_buffered_rows
        self.max_buffered_bytes = max_buffered_bytes
        self.rank = rank
        self.error: BaseException | None = None
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max_queued_items)
        self._seq = 0
        self._later_put = self._later_done = 0  # put_later's bytes queued, and done (each counter has one writing thread)
        self.merge_every = merge_every
        self.max_merged_rows = max_merged_rows
        self.compact_at_close = COMPACT_AT_CLOSE if compact_at_close is None else compact_at_close
        # The chunks written by this writer, per table and merge level: every table is compacted, so
        # that a long run leaves tens of files, not one per flush.
        self._levels: dict[str, dict[int, list[Path]]] = {name: {} for name in fmt.TABLES}
        self._buffer = _Buffer()
        self.on_written: Callable[[], None] | None = None  # called on this writer's thread after files land
        trial_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _lock_trial(trial_dir, rank)
        try:
            self.repaired = repair_trial(trial_dir, rank=rank)  # what an earlier, crashed writer of this rank left
        except BaseException:
            os.close(self._lock)
            raise
        self._identity = fmt.folder_identity(trial_dir)
        # After chunks an earlier writer of this rank left (a resumed shard): never reuse a name, and stay
        # newer than its merged chunks (see format.visible_chunks).
        self._seq = _next_seq(trial_dir, rank)
        self._thread = threading.Thread(target=self._run, name="comgra-writer", daemon=True)
        self._thread.start()

    # -- called from the training thread -------------------------------------------------
    def put_table(self, name: str, table: pa.Table) -> None:
        self._put(("table", (name, table)))

    def put_later(self, names: tuple[str, ...], make: Callable[[], tuple[pa.Table, ...]], size: int) -> None:
        """``make()`` runs on this writer's thread, in queue order, and its tables go to ``names`` (capture/step.py:
        a recorded step's rows built here, off the training thread); ``size``: the bytes it holds meanwhile. A fault
        in it is the writer's fault."""
        self._later_put += size
        self._put(("later", (names, make, size)))

    def takes_later(self, size: int) -> bool:
        """Whether a ``put_later`` of ``size`` bytes is welcome now: what waits stays under LATER_BYTES."""
        return self._later_put - self._later_done + size <= LATER_BYTES and self.error is None

    def put_json(self, relative_path: str, document: dict[str, Any]) -> None:
        """Written with the next flush (within ``flush_seconds``, or at ``flush``), before its steps chunk."""
        self._put(("json", (relative_path, document)))

    def flush(self, timeout: float | None = 60.0) -> None:
        """Write everything queued so far and wait until it is on disk."""
        done = threading.Event()
        if self._put(("flush", done)):  # after a fault nothing is queued, so there is nothing to wait for
            deadline = None if timeout is None else time.monotonic() + timeout
            # Also stop waiting when the writer faults: an item queued just then is never answered.
            while not done.wait(0.05) and self.error is None and self._thread.is_alive():
                if deadline is not None and time.monotonic() > deadline:
                    break

    def close(self, timeout: float | None = 60.0) -> None:
        if self._thread.is_alive():
            self.flush(timeout)
            self._put(("stop", None))
            self._thread.join(timeout)

    def _put(self, item: tuple[str, Any]) -> bool:
        if self.error is None and self._thread.is_alive():
            self._queue.put(item)
            return True
        return False

    # -- the writer thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            timeout = None if self._buffer.since is None else max(
                0.0, self._buffer.since + self._interval() - time.monotonic()
            )
            try:
                kind, payload = self._queue.get(timeout=timeout)
            except queue.Empty:
                kind, payload = "tick", None
            try:
                if self._handle(kind, payload):
                    break
            except BaseException as error:  # noqa: BLE001 - reported by the recorder, never raised into training
                self.error = error
                self._drain()
                break
        os.close(self._lock)  # this rank's files are complete: repair may touch them now

    def _handle(self, kind: str, payload: Any) -> bool:
        if kind == "table":
            self._buffer.add(*payload)
        elif kind == "json":
            self._buffer.add_document(*payload)
        elif kind == "later":
            names, make, size = payload
            try:
                tables = make()
            finally:
                self._later_done += size
            for name, table in zip(names, tables):
                if table.num_rows:
                    self._buffer.add(name, table)
        elif kind == "flush":
            try:
                self._write_buffer()
            finally:  # a failed write must not leave flush() waiting for its timeout
                payload.set()
            return False
        elif kind == "stop":
            self._write_buffer()
            if self.compact_at_close:
                self._compact()
            return True
        due = self._buffer.since is not None and (
            time.monotonic() - self._buffer.since >= self._interval()
            or self._buffer.rows >= self.max_buffered_rows
            or (self.max_buffered_bytes is not None and self._buffer.bytes >= self.max_buffered_bytes)
        )
        if due:
            self._write_buffer()
        return False

    def _compact(self) -> None:
        """The run is over: each table of this rank becomes one file (store/compaction.py)."""
        for name in fmt.TABLES:
            folder = layout.rank_dir(self.trial_dir, name, self.rank)
            if len(fmt.chunk_names(folder)) > 1:
                compact_folder(folder, name, check=self._check_trial_folder)
        release_unused_memory(trim=True)
        self._written()

    def _written(self) -> None:
        if self.on_written is not None:  # the uploader of a URL root (store.uploader): new files to send
            self.on_written()

    def _interval(self) -> float:
        age = time.monotonic() - self._started
        return min(self.max_flush_seconds, max(self.flush_seconds, age / 16))

    def _drain(self) -> None:
        """After a fault: empty the queue once, so that a training thread blocked on a full queue goes on.

        ``error`` is set first, so nothing more is queued (``_put``) and this thread can end."""
        while True:
            try:
                kind, payload = self._queue.get_nowait()
            except queue.Empty:
                return
            if kind == "flush":
                payload.set()

    def _check_trial_folder(self) -> None:
        """Refuse to write into a trial folder that was removed or replaced: recreating it would leave an
        index whose graphs and earlier chunks are gone."""
        # The folder's identity, not its trial.json: another rank may be replacing trial.json right now.
        if fmt.folder_identity(self.trial_dir) != self._identity:
            raise TrialFolderGone(
                f"the trial folder {str(self.trial_dir)!r} was removed or replaced while recording; comgra "
                "stopped writing to it and did not recreate it")

    def _write_buffer(self) -> None:
        buffer, self._buffer = self._buffer, _Buffer()
        if buffer.empty():
            return
        self._check_trial_folder()
        # Steps last: the steps chunk is the commit record of a training step, so a reader (or a kill, or a
        # power loss) that sees a step in the index also finds its graph, values, KPIs and notes (see _publish).
        staged: list[_Staged] = []
        try:
            for relative_path, document in buffer.documents.items():
                path = self.trial_dir / relative_path
                path.parent.mkdir(exist_ok=True)  # never the trial folder's parents: see _check_trial_folder
                text = fmt.json_text(document)
                staged.append(_Staged("json", path, fmt.write_temporary(path, lambda tmp: tmp.write_text(text))))
            for name in ("tensors", "kpis", "notes", "layers", "resources", "runinfo", "sentinels", "steps"):
                tables = buffer.tables[name]
                if not tables:
                    continue
                table = layout.to_file(name, pa.concat_tables([fmt.with_added_columns(name, t) for t in tables]))
                first, last = _step_range(name, table)
                folder = layout.rank_dir(self.trial_dir, name, self.rank)
                folder.mkdir(parents=True, exist_ok=True)  # outside the trial folder (format 3): see store/layout.py
                path = folder / fmt.chunk_name(self._seq, first, last, self.rank)
                staged.append(_Staged(name, path, _encode_temporary(name, path, table, FRESH_COMPRESSION)))
            self._publish(staged)
        except BaseException:
            for chunk in staged:
                chunk.temporary.unlink(missing_ok=True)
            raise
        for chunk in staged:
            if chunk.name in self._levels:
                self._levels[chunk.name].setdefault(0, []).append(chunk.path)
        self._seq += 1
        merged = [self._merge(name) for name in fmt.TABLES]
        release_unused_memory(trim=any(merged))
        self._written()

    def _publish(self, staged: list[_Staged]) -> None:
        """Rename a flush's chunks into place, the steps chunk last, with as few waits on the disk as that allows.

        Durable before visible: every file's bytes are fsynced before its rename, and the data chunks'
        renames are made durable (their folders fsynced) before the steps chunk is renamed, so that after
        a power loss too a step in the index has its data. Within each of these three phases the fsyncs
        run at once on a few threads (one journal commit instead of one per file: ResNet-18's flush of
        three chunks and ``finalize`` waited 3-4x longer with them in a row).
        """
        durable = fmt.DURABLE_WRITES
        data = [chunk for chunk in staged if chunk.name != "steps"]
        commit = [chunk for chunk in staged if chunk.name == "steps"]
        if durable:
            self._fsync_all([(chunk.temporary, os.O_RDONLY) for chunk in staged])
        for chunk in data:
            os.replace(chunk.temporary, chunk.path)
        if durable:
            self._fsync_all([(folder, _FOLDER) for folder in dict.fromkeys(chunk.path.parent for chunk in data)])
        for chunk in commit:
            os.replace(chunk.temporary, chunk.path)
            if durable:
                fmt._fsync(chunk.path.parent, _FOLDER)

    def _fsync_all(self, paths: list[tuple[Path, int]]) -> None:
        """fsync these files or folders at once (fsync releases the GIL); returns when all are done.

        Short-lived threads, not a pool: the recorder's finalize may run in an ``atexit`` handler, and by then
        Python has shut the thread pools of ``concurrent.futures`` down (they refuse new work)."""
        errors: list[BaseException] = []

        def sync(path: Path, flags: int) -> None:
            try:
                fmt._fsync(path, flags)
            except BaseException as error:  # noqa: BLE001 - re-raised on the writer thread below
                errors.append(error)

        helpers = [threading.Thread(target=sync, args=item, name="comgra-fsync", daemon=True) for item in paths[1:]]
        for helper in helpers:
            helper.start()
        for item in paths[:1]:
            sync(*item)
        for helper in helpers:  # all of them, also when one fails: nothing of this flush is still syncing after it
            helper.join()
        if errors:
            raise errors[0]

    def _merge(self, name: str) -> bool:
        """Tiered compaction: every ``merge_every`` chunks of one level become one chunk of the next, up
        to ``max_merged_rows`` rows. A query across all steps pays per chunk, a query for one step per
        row group it decodes and per footer it reads, so chunks stay few (tens for a long run) but
        never huge. True if a merge was written."""
        levels = self._levels[name]
        level = 0
        while len(levels.get(level, [])) >= self.merge_every:
            parts, levels[level] = levels[level], []
            if sum(pq.read_metadata(p).num_rows for p in parts) > self.max_merged_rows:
                continue  # big enough: these chunks stay as they are
            table = pa.concat_tables([_read_part(p) for p in parts]).cast(fmt.FILE_SCHEMAS[name])
            first = min(fmt.step_range_of(p.name)[0] for p in parts)
            last = max(fmt.step_range_of(p.name)[1] for p in parts)
            self._check_trial_folder()
            folder = layout.rank_dir(self.trial_dir, name, self.rank)
            merged = folder / fmt.chunk_name(self._seq, first, last, self.rank, level + 1)
            self._seq += 1
            _write_chunk(name, merged, table)
            # At once after the merged chunk is in place: comgra's reader ignores covered parts, a plain
            # reader counts them twice until they are gone (and repair deletes them after a crash).
            for part in parts:
                part.unlink(missing_ok=True)
            levels.setdefault(level + 1, []).append(merged)
            level += 1
        return level > 0


def release_unused_memory(*, trim: bool) -> None:
    """Hand the memory a chunk write or a merge used back to the system, on this (the writer's) thread
    (the findings scan calls it too, after a scan).

    The allocators keep freed pages for reuse, so each merge, which holds its parts and the merged
    table at once, left the process's RSS at the high-water mark of the largest merge so far, and a
    100,000-step run grew by about 10% in steps at its merges. Arrow's own allocator (mimalloc or
    jemalloc) is asked after every write (about a microsecond): it reaches the pages of this thread's
    heap, which is why a merge reads its parts on this thread (``_read_part``). glibc's malloc, which
    compression and the Parquet code use too, is trimmed after a merge only (a few per run).
    """
    pa.default_memory_pool().release_unused()
    if trim and _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _find_malloc_trim() -> Any:
    """glibc's malloc_trim, or None elsewhere (musl, macOS, Windows), where there is nothing to do."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


_MALLOC_TRIM = _find_malloc_trim()


def _lock_trial(trial_dir: Path, rank: int) -> int:
    """Hold this rank's writer lock for the writer's life (the kernel frees it when the process dies)."""
    descriptor = os.open(fmt.writer_lock_path(trial_dir, rank), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise BlockingIOError(f"another writer is recording rank {rank} of {str(trial_dir)!r} now; give this "
                              "run another trial_id") from None
    return descriptor


def _next_seq(trial_dir: Path, rank: int) -> int:
    seqs = [fmt.seq_of(p.name) for table in fmt.TABLES for p in fmt.chunk_files(layout.rank_dir(trial_dir, table, rank))
            if fmt.rank_of(p.name) == rank]
    return max(seqs, default=-1) + 1


def _step_range(name: str, table: pa.Table) -> tuple[int, int]:
    column = {"steps": "training_step", "tensors": "training_step", "kpis": "timepoint",
              "layers": "training_step", "resources": "training_step", "runinfo": "training_step",
              "sentinels": "training_step"}.get(name)
    if column is None or table.num_rows == 0:
        return 0, 0
    bounds = pc.min_max(table[column])
    return max(0, bounds["min"].as_py()), max(0, bounds["max"].as_py())
