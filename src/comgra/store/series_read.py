"""One tensor's statistic across every tensors chunk, reading only the row groups that can hold it.

A tensors chunk is sorted by node first (``format.TENSOR_SORT``) and written in row groups of
``format.TENSOR_ROW_GROUP`` rows, and its footer holds each row group's smallest and largest node. The
row groups of one node are therefore one run, found by bisection over those bounds. DuckDB prunes row
groups by the same statistics, but it checks every row group's bounds on every query (about 25 us each,
with its footer cache warm): at 192 nodes x 50x steps a trial has 19,080 row groups, of which a series
needs 90, and at 1,002 nodes x 50x about 100,000. Here the bounds are read once per chunk (chunks are
immutable) and a series costs the few row groups it reads.

The parsed footers are kept, as DuckDB's ``parquet_metadata_cache`` keeps them for its own reads: re-parsing
a footer on every read costs more than the read (a 192-node chunk's footer is 1.5 MB).
"""
from __future__ import annotations

import bisect
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


@dataclass(frozen=True)
class _Footer:
    metadata: pq.FileMetaData
    node_min: list[str]  # per row group, ascending in a chunk sorted by node
    node_max: list[str]
    sorted_by_node: bool  # False (a foreign or unsorted chunk, a missing statistic): every row group is read

    def row_groups(self, node: str) -> list[int]:
        if not self.sorted_by_node:
            return list(range(self.metadata.num_row_groups))
        return list(range(bisect.bisect_left(self.node_max, node), bisect.bisect_right(self.node_min, node)))


def _footer(path: Path) -> _Footer:
    metadata = pq.read_metadata(path)
    column = metadata.schema.names.index("node")
    bounds = []
    for index in range(metadata.num_row_groups):
        statistics = metadata.row_group(index).column(column).statistics
        if statistics is None or not statistics.has_min_max or not isinstance(statistics.min, str):
            return _Footer(metadata, [], [], False)
        bounds.append((statistics.min, statistics.max))
    low, high = [b[0] for b in bounds], [b[1] for b in bounds]
    ordered = all(a <= b for a, b in zip(low, low[1:])) and all(a <= b for a, b in zip(high, high[1:]))
    return _Footer(metadata, low, high, ordered and all(a <= b for a, b in bounds))


class SeriesReader:
    """Reads one series from tensors chunks; thread-safe. Footers are kept per file and version (path, size,
    modification time), so a file replaced under the same name is read again."""

    def __init__(self) -> None:
        self._footers: dict[tuple[str, int, int], _Footer] = {}
        self._lock = threading.Lock()

    def read(self, paths: list[Path], columns: list[str], filters: dict[str, Any], empty: pa.Table) -> pa.Table:
        """``columns`` of the rows equal to every non-None value of ``filters`` (which names a node), in
        chunk order (``empty`` when there are none); raises what pyarrow raises for a damaged or vanished
        chunk (the caller falls back to a read that finds and reports it)."""
        active = {k: v for k, v in filters.items() if v is not None}
        condition = None
        for name, value in active.items():
            term = pc.field(name) == value
            condition = term if condition is None else condition & term
        needed = list(dict.fromkeys([*columns, *active]))
        parts = []
        for path in paths:
            footer = self._footer_of(path)
            groups = footer.row_groups(active["node"])
            if groups:
                rows = pq.ParquetFile(path, metadata=footer.metadata).read_row_groups(
                    groups, columns=needed, use_threads=False)
                parts.append(rows.filter(condition).select(columns))
        return pa.concat_tables(parts) if parts else empty

    def _footer_of(self, path: Path) -> _Footer:
        status = os.stat(path)
        key = (str(path), status.st_size, status.st_mtime_ns)
        with self._lock:
            footer = self._footers.get(key)
        if footer is None:
            footer = _footer(path)
            with self._lock:
                self._footers[key] = footer
        return footer

    def forget_all_but(self, listed: list[Path]) -> None:
        """Drop the footers of chunks no longer listed (merged away by a live writer, or replaced)."""
        names = {str(p) for p in listed}
        with self._lock:
            if len(self._footers) > len(names):
                self._footers = {k: v for k, v in self._footers.items() if k[0] in names}
