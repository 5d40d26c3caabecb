"""The DuckDB connection of one ``TrialReader``, opened again once what DuckDB keeps of chunks that are gone
passes a size (issue 31 item 13).

The reader turns on DuckDB's ``parquet_metadata_cache``: without it every query parses again the footer of
every chunk it reads. That cache keeps each Parquet file's parsed footer, keyed by path, for as long as the
DuckDB database lives, and lets go of none: a live writer merges its chunks into new files and deletes the
parts, so a server reading a live run kept the footers of every chunk it had ever read (about ten times the
footer's size on disk; 61 KiB per chunk of 20 row groups), and grew with the run for as long as it ran.

Here the chunks DuckDB has read are counted with their footers' sizes. When a listing of the trial's tensors
chunks (``listed``) no longer holds some of them, their estimated share is added up; once it passes
``GONE_BUDGET_BYTES`` the connection is let go and the next query opens a fresh one (a fresh cache, in which
the live chunks' footers are parsed once again). Queries running on the old connection finish on it: each
thread's cursor keeps it alive until that thread's next query, which takes a cursor of the new one.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

import duckdb

PARSED_FOOTER_FACTOR = 10  # DuckDB's parsed footer against the footer on disk (measured: about 9)
# Estimated memory of the cached footers of chunks gone, before a fresh connection. The RSS of a server on a live run
# is a saw of this height (a fresh connection every few minutes of 20 steps a second): 8 MiB before round six.
GONE_BUDGET_BYTES = 2 * 2**20
UNKNOWN_FOOTER_BYTES = 16 * 1024  # a footer whose size cannot be read (a remote chunk's tail not fetched yet)
# DuckDB's footer cache is turned on once a chunk with a footer this large is read (as ``series_read`` keeps only
# such footers parsed): parsing a small one again costs about 11 us per KiB, while a live run's small chunks, all
# kept parsed, grew with it (issue 31 item 13, round six).
CACHE_FOOTERS_FROM_BYTES = 64 * 1024


class ReaderConnection:
    """One DuckDB database per reader, a cursor per thread; thread-safe."""

    def __init__(self, gone_budget: int | None = None) -> None:
        self._connection: duckdb.DuckDBPyConnection | None = None
        self._generation = 0  # how many connections were opened: a thread's cursor of an older one is replaced
        self._local = threading.local()
        self._read: dict[str, int] = {}  # chunk read by the open connection -> estimated bytes DuckDB keeps of it
        self._gone = 0  # estimated bytes DuckDB keeps of chunks no longer listed
        self._budget = GONE_BUDGET_BYTES if gone_budget is None else gone_budget
        self._cache_footers = False  # DuckDB's parquet_metadata_cache: on once a large footer was met (then for good)
        self._lock = threading.Lock()

    @property
    def connection(self) -> duckdb.DuckDBPyConnection | None:
        """The open connection (None before the first query, and right after it was let go)."""
        return self._connection

    @property
    def generation(self) -> int:
        """How many connections were opened so far."""
        return self._generation

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's cursor of the open connection (opened here on first use, 4 MiB)."""
        with self._lock:
            if self._connection is None:
                self._connection = duckdb.connect()
                if self._cache_footers:
                    self._turn_on_footer_cache()
                # DuckDB's allocator keeps what a query freed until a query's peak passes this (128 MiB by
                # default): a server answering many small queries kept it all (docs/performance.md).
                self._connection.execute("SET GLOBAL allocator_flush_threshold = '4MB'")
                self._generation += 1
            generation, connection = self._generation, self._connection
        mine = getattr(self._local, "cursor", None)
        if mine is not None and mine[0] == generation:
            return mine[1]
        if mine is not None:
            mine[1].close()  # this thread's cursor of a connection let go: no query of this thread runs on it
        cursor = connection.cursor()
        self._local.cursor = (generation, cursor)
        return cursor

    def _turn_on_footer_cache(self) -> None:
        """Under the lock. GLOBAL: a plain SET does not reach the per-thread cursors, which then re-read every footer."""
        if self._connection is not None:
            self._connection.execute("SET GLOBAL parquet_metadata_cache = true")

    def reading(self, paths: Iterable[Path]) -> None:
        """Count the chunks a query is about to read (each once per connection, by its footer's size); a large
        footer among them turns DuckDB's footer cache on."""
        with self._lock:
            new = [str(p) for p in paths if str(p) not in self._read]
        sizes = {path: footer_bytes(path) for path in new}  # outside the lock: file reads
        with self._lock:
            if not self._cache_footers and any(size >= CACHE_FOOTERS_FROM_BYTES for size in sizes.values()):
                self._cache_footers = True
                self._turn_on_footer_cache()
            self._read.update({path: PARSED_FOOTER_FACTOR * size for path, size in sizes.items()})

    def listed(self, paths: Iterable[Path]) -> None:
        """Every tensors chunk of the trial now: those read and no longer here are gone (merged away or
        replaced); past the budget, the connection is let go."""
        if not self._read:
            return
        names = {str(p) for p in paths}
        with self._lock:
            for gone in [p for p in self._read if p not in names]:
                kept = self._read.pop(gone)
                self._gone += kept if self._cache_footers else 0  # with its cache off, DuckDB keeps nothing of it
            if self._gone > self._budget:
                self._connection, self._read, self._gone = None, {}, 0


def footer_bytes(path: str) -> int:
    """The length of a Parquet file's footer, from its last 8 bytes."""
    try:
        with open(path, "rb") as file:
            file.seek(-8, os.SEEK_END)
            tail = file.read(8)
    except OSError:
        return UNKNOWN_FOOTER_BYTES
    if len(tail) == 8 and tail[4:] == b"PAR1":
        return int.from_bytes(tail[:4], "little") or UNKNOWN_FOOTER_BYTES
    return UNKNOWN_FOOTER_BYTES
