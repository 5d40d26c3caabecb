"""One tensor's statistic across every tensors chunk, reading only the row groups that can hold it.

A tensors chunk is sorted by node first (``format.TENSOR_SORT``) and written in row groups of
``format.TENSOR_ROW_GROUP`` rows, and its footer holds each row group's smallest and largest node. The
row groups of one node are therefore one run, found by bisection over those bounds. DuckDB prunes row
groups by the same statistics, but it checks every row group's bounds on every query (about 25 us each,
with its footer cache warm): at 192 nodes x 50x steps a trial has 19,080 row groups, of which a series
needs 90, and at 1,002 nodes x 50x about 100,000. Here the bounds are read once per chunk (chunks are
immutable) and a series costs the few row groups it reads.

The parsed footers are kept, as DuckDB's ``parquet_metadata_cache`` keeps them for its own reads: re-parsing
a footer on every read costs more than the read (a 192-node chunk's footer is 1.5 MB). They are kept within
a memory budget (``FOOTER_BUDGET_BYTES``): a parsed footer takes about ten times its size on disk.
"""
from __future__ import annotations

import bisect
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from comgra.store import format as fmt
from comgra.store import layout, validation

_TYPE = "type_of_execution"  # tensors' column of the step's type (format.ADDED_COLUMNS)


class ReadCancelled(Exception):
    """The caller's ``cancelled()`` said so between two chunks: nobody waits for this read any more."""


# What a parsed footer costs in memory, per byte of its serialized form: measured 9.4 on the 1,002-node
# 50x chunks (100 footers: 44 MiB serialized, 414 MiB more RSS), so the estimate errs a little high.
PARSED_FOOTER_FACTOR = 10
# The parsed footers kept at most (estimated). At 1,002 nodes x 50x one trial's 480 footers take 2.1 GB;
# with 1 GiB kept, half of them are parsed again by each series (about 7 ms of CPU per chunk): a series of
# a new tensor there costs 2.1-2.9 s of CPU instead of 0.9-1.2 s (0.5 GiB: 3.5-4.9 s).
FOOTER_BUDGET_BYTES = 2**30
# Only a footer at least this large on disk is kept parsed: parsing one again costs about 11 us per KiB (a 10 KiB
# footer 0.11 ms, against the millisecond its row groups' read takes), while a live run's many small chunks kept
# parsed grew with it (ten times their footers, about 0.25 MiB a minute at 20 steps a second; issue 31 item 13).
KEEP_PARSED_FROM_BYTES = 64 * 1024
# The rows each chunk gave a series, kept per series (least recently read first out) within this many bytes: a
# chunk never changes, so asking a live run's series again reads only the chunks written (or merged) since. Without
# them every request read every chunk again: the work, and the heap it churns, grew with the run (issue 31 item 13).
SERIES_MEMO_BYTES = 16 * 2**20
# What a kept part costs besides its buffers (the Table and its arrays' objects), counted against the budget.
_PART_OVERHEAD_BYTES = 512


@dataclass(frozen=True)
class _Bounds:
    """What a read needs to know of a chunk besides its parsed footer: kept for every chunk (a few KB)."""
    num_row_groups: int
    node_min: list[str]  # per row group, ascending in a chunk sorted by node
    node_max: list[str]
    sorted_by_node: bool  # False (a foreign or unsorted chunk, a missing statistic): every row group is read
    parsed_bytes: int  # the parsed footer's estimated memory
    has_rank: bool = True  # format 3 has no rank column: its folder names the rank
    has_type: bool = True  # chunks written before tensors' type_of_execution (format.ADDED_COLUMNS) lack it

    def row_groups(self, node: str) -> list[int]:
        if not self.sorted_by_node:
            return list(range(self.num_row_groups))
        return list(range(bisect.bisect_left(self.node_max, node), bisect.bisect_right(self.node_min, node)))


def _bounds(metadata: pq.FileMetaData) -> _Bounds:
    column = metadata.schema.names.index("node")
    size = metadata.serialized_size * PARSED_FOOTER_FACTOR
    bounds = []
    for index in range(metadata.num_row_groups):
        statistics = metadata.row_group(index).column(column).statistics
        if statistics is None or not statistics.has_min_max or not isinstance(statistics.min, str):
            return _Bounds(metadata.num_row_groups, [], [], False, size, "rank" in metadata.schema.names,
                           _TYPE in metadata.schema.names)
        # interned: the same few hundred node names bound the row groups of every chunk
        bounds.append((sys.intern(statistics.min), sys.intern(statistics.max)))
    low, high = [b[0] for b in bounds], [b[1] for b in bounds]
    ordered = all(a <= b for a, b in zip(low, low[1:])) and all(a <= b for a, b in zip(high, high[1:]))
    return _Bounds(metadata.num_row_groups, low, high, ordered and all(a <= b for a, b in bounds), size,
                   "rank" in metadata.schema.names, _TYPE in metadata.schema.names)


def _size(parts: dict[Any, pa.Table | None]) -> int:
    """What a series' kept parts take in memory (estimated)."""
    return sum(_PART_OVERHEAD_BYTES + (0 if part is None else part.nbytes) for part in parts.values())


class SeriesReader:
    """Reads one series from tensors chunks; thread-safe. What is kept is keyed by file and version (path,
    size, modification time), so a file replaced under the same name is read again.

    Every chunk's row-group bounds are kept; its parsed footer only if it is at least ``keep_from`` bytes on disk, and
    while the footers kept fit in ``footer_budget`` bytes (estimated). Footers met first are kept, later ones are parsed, used and let go:
    a series reads every chunk in the same order, and a least-recently-used cache smaller than the trial
    would drop each footer just before the next series needs it again, keeping none of use.

    The rows each chunk gave a series are kept too (``memo_budget`` bytes, ``SERIES_MEMO_BYTES`` by default; the
    least recently read series let go first): the same series asked again reads only the chunks it has not read.
    """

    def __init__(self, footer_budget: int = FOOTER_BUDGET_BYTES, *,
                 fill: Callable[[Path, list[int], list[str]], None] | None = None,
                 keep_from: int = KEEP_PARSED_FROM_BYTES, memo_budget: int | None = None) -> None:
        self._fill = fill  # a recording at a URL: the row groups' ranges fetched before they are read (store.ranges)
        self._bounds: dict[tuple[str, int, int], _Bounds] = {}
        self._parsed: dict[tuple[str, int, int], pq.FileMetaData] = {}
        self._parsed_bytes = 0
        self._budget = footer_budget
        self._keep_from = keep_from * PARSED_FOOTER_FACTOR  # compared with ``_Bounds.parsed_bytes``
        self._lock = threading.Lock()
        # (columns, filters) -> {chunk version -> its rows, None where it has none}, and each entry's bytes
        self._memo: OrderedDict[tuple, dict[tuple[str, int, int], pa.Table | None]] = OrderedDict()
        self._memo_bytes: dict[tuple, int] = {}
        self._memo_budget = SERIES_MEMO_BYTES if memo_budget is None else memo_budget
        self.chunks_read = 0  # chunks whose row groups were read (not taken from what is kept): for tests

    @property
    def kept_series_bytes(self) -> int:
        """The bytes of the series' rows kept now (at most the budget)."""
        with self._lock:
            return sum(self._memo_bytes.values())

    @property
    def kept_footer_bytes(self) -> int:
        """The estimated memory of the parsed footers kept now (at most the budget)."""
        return self._parsed_bytes

    def read(self, paths: list[Path], columns: list[str], filters: dict[str, Any], empty: pa.Table,
             cancelled: Callable[[], bool] | None = None) -> pa.Table:
        """``columns`` of the rows equal to every non-None value of ``filters`` (which names a node), in
        chunk order (``empty`` when there are none); raises what pyarrow raises for a damaged or vanished
        chunk (the caller falls back to a read that finds and reports it), and ``ReadCancelled`` as soon as
        ``cancelled()`` is true between two chunks (a read of seconds, which a newer one made useless)."""
        active = {k: v for k, v in filters.items() if v is not None}
        memo_key = (tuple(columns), tuple(sorted(active.items(), key=lambda item: item[0])))
        with self._lock:
            known = self._memo.get(memo_key, {})
        parts, now = [], {}
        for path in paths:
            if cancelled is not None and cancelled():
                raise ReadCancelled(f"the series of {active['node']!r} is no longer wanted")
            status = os.stat(path)
            version = (str(path), status.st_size, status.st_mtime_ns)
            if version in known:
                part = now[version] = known[version]
            else:
                part = now[version] = self._read_chunk(path, version, columns, active)
            if part is not None:
                parts.append(part)
        self._keep(memo_key, now)
        return pa.concat_tables(parts) if parts else empty

    def _read_chunk(self, path: Path, version: tuple[str, int, int], columns: list[str],
                    active: dict[str, Any]) -> pa.Table | None:
        """The rows of one chunk (None: it has none)."""
        bounds, metadata = self._footer_of(path, version)
        groups = bounds.row_groups(active["node"])
        if not groups:
            return None
        # A format-3 chunk holds one rank's rows, named by its folder: the rank is no column to filter.
        rank = None if bounds.has_rank else layout.rank_of_chunk(path)
        if rank is not None and active.get("rank", rank) != rank:
            return None
        # An older chunk has no type column: its step numbers were unique, its rows are any type's.
        here = {k: v for k, v in active.items() if (bounds.has_rank or k != "rank") and (k != _TYPE or bounds.has_type)}
        condition = None
        for name, value in here.items():
            term = pc.field(name) == value
            if name == _TYPE:
                term = term | pc.field(name).is_null()
            condition = term if condition is None else condition & term
        needed = list(dict.fromkeys([*(c for c in columns if bounds.has_rank or c != "rank"), *here]))
        # Each page read is checked against its checksum: a failure sends the caller to the reader's own route,
        # which reports the chunk.
        if self._fill is not None:
            self._fill(path, groups, needed)
        rows = pq.ParquetFile(path, metadata=metadata, page_checksum_verification=True).read_row_groups(
            groups, columns=needed, use_threads=False).filter(condition)
        self.chunks_read += 1
        if rank is not None and "rank" in columns:
            rows = rows.append_column(fmt.RANK_FIELD, pa.repeat(pa.scalar(rank, pa.int32()), rows.num_rows))
        return rows.select(columns).combine_chunks()

    def _keep(self, memo_key: tuple, parts: dict[tuple[str, int, int], pa.Table | None]) -> None:
        """Keep a series' parts (those of the chunks it read now only: one merged away is let go), the least recently
        read series let go first past the budget; one larger than the budget alone is not kept."""
        size = _size(parts)
        with self._lock:
            self._memo.pop(memo_key, None)
            self._memo_bytes.pop(memo_key, None)
            if size > self._memo_budget:
                return
            self._memo[memo_key], self._memo_bytes[memo_key] = parts, size
            kept = sum(self._memo_bytes.values())
            while kept > self._memo_budget:
                oldest, _ = self._memo.popitem(last=False)
                kept -= self._memo_bytes.pop(oldest)

    def row_groups_of(self, path: Path, node: str) -> list[int]:
        """The row groups of a chunk that can hold ``node`` (all of them where its footer cannot tell)."""
        return self._footer_of(path)[0].row_groups(node)

    def _footer_of(self, path: Path, key: tuple[str, int, int] | None = None) -> tuple[_Bounds, pq.FileMetaData | None]:
        """The chunk's bounds, and its parsed footer where it is kept or parsed now (None: ParquetFile
        parses it again); ``key``: the chunk's version, where the caller has it."""
        if key is None:
            status = os.stat(path)
            key = (str(path), status.st_size, status.st_mtime_ns)
        with self._lock:
            bounds, metadata = self._bounds.get(key), self._parsed.get(key)
        if bounds is not None:
            return bounds, metadata
        metadata = pq.read_metadata(path)
        # A column of the right name and another type is junk, not values (raises validation.ChunkDamaged).
        validation.check_chunk_schema(metadata.schema.to_arrow_schema(), fmt.SCHEMAS["tensors"], rank_optional=True,
                                      may_lack=fmt.added_column_names("tensors"))
        bounds = _bounds(metadata)
        with self._lock:
            if key not in self._bounds:
                self._bounds[key] = bounds
                if self._keep_from <= bounds.parsed_bytes and self._parsed_bytes + bounds.parsed_bytes <= self._budget:
                    self._parsed[key] = metadata
                    self._parsed_bytes += bounds.parsed_bytes
        return bounds, metadata

    def forget_all_but(self, listed: list[Path]) -> None:
        """Drop what is kept of chunks no longer listed (merged away by a live writer, or replaced)."""
        names = {str(p) for p in listed}
        with self._lock:
            if len(self._bounds) > len(names):
                self._bounds = {k: v for k, v in self._bounds.items() if k[0] in names}
                self._parsed = {k: v for k, v in self._parsed.items() if k[0] in names}
                self._parsed_bytes = sum(self._bounds[k].parsed_bytes for k in self._parsed)
                stale = [key for key, parts in self._memo.items() if any(v[0] not in names for v in parts)]
                for memo_key in stale:  # a series' parts of chunks merged away
                    parts = {k: v for k, v in self._memo[memo_key].items() if k[0] in names}
                    self._memo[memo_key], self._memo_bytes[memo_key] = parts, _size(parts)
