"""A background thread that turns queued rows into immutable Parquet chunks.

The training thread only enqueues Arrow tables; compression and disk I/O
happen here. A fault on this thread (a full disk, a folder that is not
writable) is kept in ``error`` and reported by the recorder; it never raises
into the training loop.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from comgra.store import format as fmt


@dataclass
class _Buffer:
    tables: dict[str, list[pa.Table]] = field(default_factory=lambda: {name: [] for name in fmt.TABLES})
    rows: int = 0
    since: float | None = None

    def add(self, name: str, table: pa.Table) -> None:
        self.tables[name].append(table)
        self.rows += table.num_rows
        if self.since is None:
            self.since = time.monotonic()


class ChunkWriter:
    """Writes the chunks of one trial.

    ``flush_seconds`` bounds how stale a live view can be at the start of a run. The interval
    then grows with the run's age (a sixteenth of it, at most ``max_flush_seconds``), so that a
    long run leaves tens of chunks rather than thousands: a query across all steps pays per chunk.
    """

    def __init__(
        self,
        trial_dir: Path,
        *,
        flush_seconds: float = 2.0,
        max_flush_seconds: float = 30.0,
        max_buffered_rows: int = 100_000,
        max_queued_items: int = 256,
        rank: int = 0,
        merge_every: int = 16,
        max_merged_rows: int = 1_000_000,
    ):
        self.trial_dir = trial_dir
        self.flush_seconds = flush_seconds
        self.max_flush_seconds = max(flush_seconds, max_flush_seconds)
        self._started = time.monotonic()
        self.max_buffered_rows = max_buffered_rows
        self.rank = rank
        self.error: BaseException | None = None
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max_queued_items)
        self._seq = 0
        self.merge_every = merge_every
        self.max_merged_rows = max_merged_rows
        self._levels: dict[int, list[Path]] = {}  # tensors chunks written by this writer, by merge level
        self._buffer = _Buffer()
        self._thread = threading.Thread(target=self._run, name="comgra-writer", daemon=True)
        self._thread.start()

    # -- called from the training thread -------------------------------------------------
    def put_table(self, name: str, table: pa.Table) -> None:
        self._put(("table", (name, table)))

    def put_json(self, relative_path: str, document: dict[str, Any]) -> None:
        self._put(("json", (relative_path, document)))

    def flush(self, timeout: float | None = 60.0) -> None:
        """Write everything queued so far and wait until it is on disk."""
        done = threading.Event()
        if self._put(("flush", done)):  # after a fault nothing is queued, so there is nothing to wait for
            done.wait(timeout)

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
                    return
            except BaseException as error:  # noqa: BLE001 - reported by the recorder, never raised into training
                self.error = error
                self._drain()
                return

    def _handle(self, kind: str, payload: Any) -> bool:
        if kind == "table":
            self._buffer.add(*payload)
        elif kind == "json":
            relative_path, document = payload
            fmt.write_json_atomic(self.trial_dir / relative_path, document)
        elif kind == "flush":
            try:
                self._write_buffer()
            finally:  # a failed write must not leave flush() waiting for its timeout
                payload.set()
            return False
        elif kind == "stop":
            self._write_buffer()
            return True
        due = self._buffer.since is not None and (
            time.monotonic() - self._buffer.since >= self._interval()
            or self._buffer.rows >= self.max_buffered_rows
        )
        if due:
            self._write_buffer()
        return False

    def _interval(self) -> float:
        age = time.monotonic() - self._started
        return min(self.max_flush_seconds, max(self.flush_seconds, age / 16))

    def _drain(self) -> None:
        """After a fault: keep taking items so that the training thread never blocks on a full queue."""
        def drain() -> None:
            while True:
                kind, payload = self._queue.get()
                if kind == "flush":
                    payload.set()
                if kind == "stop":
                    return
        threading.Thread(target=drain, name="comgra-writer-drain", daemon=True).start()

    def _write_buffer(self) -> None:
        buffer, self._buffer = self._buffer, _Buffer()
        # Tensors before steps: the steps chunk is the commit record of a training step.
        for name in ("tensors", "steps", "kpis", "notes"):
            tables = buffer.tables[name]
            if not tables:
                continue
            table = pa.concat_tables(tables).cast(fmt.SCHEMAS[name])
            first, last = _step_range(name, table)
            path = self.trial_dir / name / fmt.chunk_name(self._seq, first, last, self.rank)
            if name == "tensors":
                _write_tensors(path, table)
                self._levels.setdefault(0, []).append(path)
            else:
                fmt.write_parquet_atomic(path, table)
        self._seq += 1
        self._merge()

    def _merge(self) -> None:
        """Tiered compaction of the tensors chunks: every ``merge_every`` chunks of one level become
        one chunk of the next, up to ``max_merged_rows`` rows. A query across all steps pays per
        chunk, a query for one step per row group it decodes and per footer it reads, so chunks
        stay few (tens for a long run) but never huge."""
        level = 0
        while len(self._levels.get(level, [])) >= self.merge_every:
            parts, self._levels[level] = self._levels[level], []
            if sum(pq.read_metadata(p).num_rows for p in parts) > self.max_merged_rows:
                continue  # big enough: these chunks stay as they are
            table = pa.concat_tables([pq.read_table(p) for p in parts]).cast(fmt.TENSORS_SCHEMA)
            first, _ = fmt.step_range_of(parts[0].name)
            _, last = fmt.step_range_of(parts[-1].name)
            merged = self.trial_dir / "tensors" / fmt.chunk_name(self._seq, first, last, self.rank, level + 1)
            self._seq += 1
            _write_tensors(merged, table)
            for part in parts:  # after the merged chunk is in place: readers ignore covered parts
                part.unlink(missing_ok=True)
            self._levels.setdefault(level + 1, []).append(merged)
            level += 1


def _write_tensors(path: Path, table: pa.Table) -> None:
    """A tensors chunk: sorted so that a series is one run, in small row groups (see format)."""
    fmt.write_parquet_atomic(path, table.sort_by(fmt.TENSOR_SORT), row_group_size=fmt.TENSOR_ROW_GROUP)


def _step_range(name: str, table: pa.Table) -> tuple[int, int]:
    column = {"steps": "training_step", "tensors": "training_step", "kpis": "timepoint"}.get(name)
    if column is None or table.num_rows == 0:
        return 0, 0
    bounds = pc.min_max(table[column])
    return max(0, bounds["min"].as_py()), max(0, bounds["max"].as_py())
