"""Whether a chunk of a trial may be used: a regular file named as the writer names chunks, inside the trial
(never opened otherwise: a FIFO would block its reader forever, a link to itself recurse), whose schema is
its table's and whose pages pass their checksums. What passed is kept per chunk version (chunks are
immutable), so a page is checked once per process, not on every query. Used by ``reader.TrialReader``.
"""
from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from comgra.store import format as fmt
from comgra.store import layout, validation

# The checks of vanished chunk versions (a live writer merges every flush's chunks away) are let go once the
# kept versions have doubled since the last time: amortised one stat per version, and what is kept stays within
# twice what is on disk. (A fixed bound of 4,096 versions let a live run's server grow for its first hours.)
CHECKED_PRUNE_AT_LEAST = 64


def not_own_chunk(path: Path, trial_dir: Path) -> str | None:
    """None for a chunk that may be opened; else why not ("" for one merged away since the listing: no problem)."""
    if not fmt.is_chunk_name(path.name):
        return "not named as comgra names chunks (a foreign file)"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ""  # merged away by a live writer since the listing
    if stat.S_ISLNK(info.st_mode) or path.parent.is_symlink():
        if not validation.inside(path, trial_dir):
            return "a link to a file outside the trial"
        try:
            info = os.stat(path)
        except OSError:
            return "a link that leads nowhere or to itself"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a FIFO, a device or a folder): never opened"
    return None


@dataclass(frozen=True)
class Checked:
    """What was checked of one chunk version: its schema (always, once it is here) and pages per row group."""

    num_row_groups: int
    names: frozenset[str]  # its columns
    done: dict[int, frozenset[str]]  # row group -> the columns whose pages passed their checksums

    def covers(self, groups: list[int], wanted: frozenset[str]) -> bool:
        needed = wanted & self.names
        return all(needed <= self.done.get(group, frozenset()) for group in groups)


class ChunkChecks:
    """The schema and page checks of the chunks of one trial, each chunk version checked once. Thread-safe."""

    def __init__(self, fill: Callable[[Path, list[int], list[str]], None] | None = None) -> None:
        self._fill = fill  # a recording at a URL: the ranges of what is read fetched first (store.ranges)
        self._checked: dict[tuple[str, int, int], Checked] = {}
        self._prune_above = CHECKED_PRUNE_AT_LEAST
        self._lock = threading.Lock()

    def names_of(self, path: Path) -> frozenset[str]:
        """The columns of a chunk: from its check where it passed one, else from its footer."""
        info = os.stat(path)
        with self._lock:
            checked = self._checked.get((str(path), info.st_size, info.st_mtime_ns))
        return checked.names if checked is not None else frozenset(pq.read_schema(path).names)

    def verify(self, table: str, path: Path, wanted: frozenset[str], row_groups: Callable[[int], list[int]], *,
               rank_optional: bool) -> None:
        """Raise where the chunk's schema is not ``table``'s or a page of ``wanted`` in the row groups
        ``row_groups(count)`` picks fails its checksum."""
        info = os.stat(path)
        key = (str(path), info.st_size, info.st_mtime_ns)
        with self._lock:
            checked = self._checked.get(key)
        if checked is not None and checked.covers(row_groups(checked.num_row_groups), wanted):
            return
        with pq.ParquetFile(path, pre_buffer=False, page_checksum_verification=True) as parquet:
            if checked is None:
                validation.check_chunk_schema(parquet.schema_arrow, fmt.SCHEMAS[table], rank_optional=rank_optional,
                                              may_lack=fmt.added_column_names(table))
                check_key_columns(parquet, KEY_COLUMNS.get(table, ()))
                checked = Checked(parquet.num_row_groups, frozenset(parquet.schema_arrow.names), {})
            done = dict(checked.done)
            groups = row_groups(checked.num_row_groups)
            if self._fill is not None:
                needed = sorted({c for g in groups for c in (wanted & checked.names) - done.get(g, frozenset())})
                if needed:
                    self._fill(path, groups, needed)
            for group in groups:  # one row group in memory at a time
                missing = sorted((wanted & checked.names) - done.get(group, frozenset()))
                if missing:
                    parquet.read_row_group(group, columns=missing, use_threads=False)
                    done[group] = done.get(group, frozenset()) | frozenset(missing)
        with self._lock:
            if len(self._checked) > self._prune_above:  # versions of chunks merged away by a live writer
                self._checked = {k: v for k, v in self._checked.items() if _same_version(k)}
                self._prune_above = max(CHECKED_PRUNE_AT_LEAST, 2 * len(self._checked))
            self._checked[key] = Checked(checked.num_row_groups, checked.names, done)


def _same_version(key: tuple[str, int, int]) -> bool:
    """Whether the chunk version ``key`` (path, size, mtime) is still on disk."""
    try:
        info = os.stat(key[0])
    except OSError:
        return False
    return (info.st_size, info.st_mtime_ns) == key[1:]


def with_rank_of_format_1(table: pa.Table, rank: int = 0) -> pa.Table:
    """A chunk without a rank column (read back as nulls) holds the rows of ``rank``: 0 in format 1, its folder's in
    format 3."""
    if table["rank"].null_count == 0:
        return table
    index = table.schema.get_field_index("rank")
    return table.set_column(index, fmt.RANK_FIELD, pc.fill_null(table["rank"], pa.scalar(rank, pa.int32())))


# Columns every row of a small table has (the writer never leaves them empty): the step index is sorted
# and searched by them, so a null there is damage, not a value.
REQUIRED_COLUMNS = {"steps": ("training_step", "iteration", "type_of_execution", "graph"),
                     "kpis": ("kpi_group", "timepoint"), "notes": ()}


STEP_KEY = ("rank", "training_step", "type_of_execution", "iteration")  # an evaluation may share a training step's number
# The columns every row of a large table has: a query finds its rows by them, so a null there is damage (a
# tensors chunk whose training_step is all null would answer series points without a step).
KEY_COLUMNS = {"tensors": ("training_step", "iteration", "node", "role", "kind", "aggregation")}


def check_key_columns(parquet: pq.ParquetFile, columns: tuple[str, ...]) -> None:
    """Raise ChunkDamaged where a key column holds a null: from the footer's null counts (no page read), or,
    for a row group whose footer has none, by reading that column (once per chunk version)."""
    metadata, names = parquet.metadata, parquet.schema_arrow.names
    for column in columns:
        if column not in names:
            continue
        index = parquet.schema_arrow.get_field_index(column)
        for group in range(metadata.num_row_groups):
            statistics = metadata.row_group(group).column(index).statistics
            nulls = statistics.null_count if statistics is not None and statistics.has_null_count else None
            if nulls is None:
                nulls = parquet.read_row_group(group, columns=[column], use_threads=False)[column].null_count
            if nulls:
                raise validation.ChunkDamaged(f"damaged: {nulls} row(s) without a {column} (a column every row has)")


def first_rows(table: pa.Table, keys: tuple[str, ...]) -> np.ndarray | None:
    """The index of the first row of each distinct key, or None when every key is distinct (the usual case)."""
    if table.num_rows < 2:
        return None
    columns = np.stack([_codes(table[k]) for k in keys], axis=1)
    _, first = np.unique(columns, axis=0, return_index=True)
    return None if len(first) == table.num_rows else first


def _codes(column: pa.ChunkedArray) -> np.ndarray:
    """A key column as int64: numbers as they are, text (a type of step) by its dictionary code, null as -1."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = pc.dictionary_encode(column.combine_chunks()).indices
        return pc.fill_null(column, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return column.to_numpy(zero_copy_only=False).astype(np.int64)


def each_step_once(table: pa.Table) -> tuple[pa.Table, int]:
    """A steps chunk with each (rank, training_step, type_of_execution, iteration) once, and how many rows repeated one: the writer
    writes a step once per chunk, so a row repeated within a chunk is damage, not another step. (Across chunks a
    step may repeat: a run resumed into the same trial records it again, and both are kept.)"""
    first = first_rows(table, STEP_KEY)
    if first is None:
        return table, 0
    return table.take(pa.array(np.sort(first))), table.num_rows - len(first)


def damage_reason(error: BaseException, default: str = "damaged: not a readable Parquet file") -> str:
    """What is wrong with a chunk, in words for the problems list."""
    if isinstance(error, validation.ChunkDamaged):
        return error.reason
    if "checksum" in str(error).lower():
        return "damaged: a page fails its checksum (its values would be wrong)"
    return default


def complete(table_name: str, table: pa.Table) -> pa.Table:
    empty = [c for c in REQUIRED_COLUMNS.get(table_name, ()) if table[c].null_count]
    if empty:
        raise ValueError(f"null values in {empty}")
    return table


def read_small(table: str, path: Path, format_version: int) -> pa.Table:
    """One chunk of a small table, in the reader's schema (format.SCHEMAS): ``rank`` and the format-3 renames."""
    schema = pq.read_schema(path)
    # Columns added later (format.ADDED_COLUMNS) that an older chunk lacks read as nulls, as a missing rank does.
    lacks = tuple(n for n in fmt.added_column_names(table) if n not in schema.names)
    if format_version >= 3 and "rank" not in schema.names:
        validation.check_chunk_schema(schema, fmt.FILE_SCHEMAS[table], rank_optional=True, may_lack=lacks)
        read = pq.read_table(path, schema=fmt.FILE_SCHEMAS[table], page_checksum_verification=True)
        return layout.from_file(table, read, layout.rank_of_chunk(path))
    # Formats 1 and 2, and chunks of the recorder's row schema (tools): a missing rank is the chunk's own.
    validation.check_chunk_schema(schema, fmt.SCHEMAS[table], rank_optional=True, may_lack=lacks)
    return with_rank_of_format_1(
        pq.read_table(path, schema=fmt.SCHEMAS[table], page_checksum_verification=True), layout.rank_of_chunk(path))
