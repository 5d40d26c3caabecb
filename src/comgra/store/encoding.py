"""How the writer and compaction encode chunks: sorted rows, dictionaries where values repeat, small row groups
for tensors, LZ4 for a flush's chunks (merged away soon) and zstd for merged ones."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from comgra.store import format as fmt

# How chunks are encoded. A flush's chunks are merged away after ``merge_every`` flushes, so they are written
# for speed: LZ4 (LZ4_RAW, which DuckDB, pandas, polars and Spark 3.3+ read) took 5.2 ms of CPU for ResNet-18's
# 5-step tensors chunk against zstd's 8.5 ms, for 4.5% more bytes. A merged chunk, which is what a long run
# keeps, is written for size: zstd.
FRESH_COMPRESSION = "lz4"
MERGED_COMPRESSION = "zstd"
_DICTIONARY = {name: fmt.dictionary_columns(schema) for name, schema in fmt.FILE_SCHEMAS.items()}
_ROW_GROUP = {"tensors": fmt.TENSOR_ROW_GROUP}  # small row groups: see format.TENSOR_ROW_GROUP

def _read_part(path: Path) -> pa.Table:
    """A chunk read on this (the writer's) thread alone, so that the memory is this thread's to hand back.

    ``pq.read_table`` fetches the column chunks on Arrow's I/O thread pool (``pre_buffer``), even with
    ``use_threads=False``: the pages its buffers came from then stay cached in those idle threads' heaps,
    where releasing on this thread never reaches them, and RSS kept each merge's high-water mark.
    """
    # Checked: a part whose pages fail their checksums must not be merged into a chunk with fresh, valid ones.
    with pq.ParquetFile(path, pre_buffer=False, page_checksum_verification=True) as part:
        return part.read(use_threads=False)


def _write_chunk(name: str, path: Path, table: pa.Table) -> None:
    """A merged chunk, in place at once (tmp file, fsync, rename, fsync of the folder)."""
    table = _sorted(name, table)
    fmt._write_atomic(path, lambda tmp: _encode(name, tmp, table, MERGED_COMPRESSION))


def write_flushed_chunk(name: str, path: Path, table: pa.Table) -> None:
    """``table``, already in the writer's row order, encoded as a flush encodes it, in place at once. For
    tools that write chunks the writer would have written (benchmarks/synthetic_recording.py's presorted
    chunks, which skip the sort)."""
    fmt._write_atomic(path, lambda tmp: _encode(name, tmp, table, FRESH_COMPRESSION))


def _encode_temporary(name: str, path: Path, table: pa.Table, compression: str) -> Path:
    """``table`` as a Parquet file under a temporary name beside ``path``; the caller renames it."""
    table = _sorted(name, table)
    return fmt.write_temporary(path, lambda tmp: _encode(name, tmp, table, compression))


def _encode(name: str, tmp: Path, table: pa.Table, compression: str) -> None:
    pq.write_table(table, tmp, compression=compression, row_group_size=_ROW_GROUP.get(name, 4096),
                   write_statistics=True, use_dictionary=_DICTIONARY[name], write_page_checksum=fmt.PAGE_CHECKSUMS)


def _sorted(name: str, table: pa.Table) -> pa.Table:
    """A tensors chunk is sorted so that a series is one run (see format.TENSOR_SORT)."""
    if name != "tensors":
        return table
    order = _tensor_order(table)
    return table.sort_by(fmt.TENSOR_SORT) if order is None else table.take(order)


def _tensor_order(table: pa.Table) -> pa.Array | None:
    """The row order of ``table.sort_by(fmt.TENSOR_SORT)``, found faster; None where it cannot be (nulls, overflow).

    Arrow's sort compares up to seven columns, four of them strings, row by row: 64 ms for a merge of 16
    ResNet-18 chunks (45,000 rows). Here each string column becomes its rank among its few distinct values,
    the six series columns one integer key, and NumPy sorts by that key and the step: 25 ms, the same order
    (both sorts are stable)."""
    key = np.zeros(table.num_rows, np.int64)
    room = 2 ** 62
    for name, _ in fmt.TENSOR_SORT[:-1]:
        column = table[name]
        if column.null_count:
            return None
        code, span = _string_ranks(column) if pa.types.is_string(column.type) else _offsets(column)
        room //= span
        if room < 1:
            return None
        key = key * span + code
    return pa.array(np.lexsort((table["training_step"].to_numpy(), key)))


def _string_ranks(column: pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """Each value's rank among the column's distinct values (in Arrow's order), and how many there are."""
    encoded = pc.dictionary_encode(column).combine_chunks()
    order = pc.sort_indices(encoded.dictionary).to_numpy()
    ranks = np.empty(len(order), np.int64)
    ranks[order] = np.arange(len(order))
    return ranks[encoded.indices.to_numpy()], max(1, len(order))


def _offsets(column: pa.ChunkedArray) -> tuple[np.ndarray, int]:
    values = column.to_numpy().astype(np.int64)
    if not len(values):
        return values, 1
    values = values - values.min()
    return values, int(values.max()) + 1
