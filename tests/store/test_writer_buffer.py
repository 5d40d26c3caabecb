"""What the writer holds between flushes is bounded in bytes, however long its flush interval has grown.

The interval grows with the run's age (to 30 s after eight minutes). Bounded by time and rows only,
the buffer grew with it: a long run's memory rose steadily through its first minutes, and a model
whose recorded steps take megabytes held 30 s of them.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from comgra.store import format as fmt
from comgra.store import layout
from comgra.store.writer import ChunkWriter

ROWS_PER_TABLE, NAME_BYTES, TABLES = 200, 1000, 40  # about 200 KB a table, 8 MB in all, 8,000 rows


def fat_kpi_table(first: int) -> pa.Table:
    """KPI rows of about 1 KB each (long names): bytes add up long before the writer's row bound."""
    return pa.table({"kpi_group": ["g"] * ROWS_PER_TABLE, "kpi_name": ["n" * NAME_BYTES] * ROWS_PER_TABLE,
                     "type_of_execution": ["main"] * ROWS_PER_TABLE,
                     "timepoint": list(range(first, first + ROWS_PER_TABLE)),
                     "value": [float(i) for i in range(ROWS_PER_TABLE)]}, schema=fmt.KPIS_SCHEMA)


def chunks_written(folder: Path, at_least: int, seconds: float = 20.0) -> list[Path]:
    deadline = time.monotonic() + seconds
    while len(files := fmt.chunk_files(folder)) < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
    return files


def test_an_old_run_writes_its_buffer_once_it_holds_max_buffered_bytes(tmp_path: Path) -> None:
    writer = ChunkWriter(tmp_path / "trial", merge_every=1000, compact_at_close=False)
    writer._started -= 3600  # an hour into the run: the interval has grown to max_flush_seconds (30 s)
    assert writer._interval() == writer.max_flush_seconds
    table_bytes = fat_kpi_table(0).nbytes
    for index in range(TABLES):
        writer.put_table("kpis", fat_kpi_table(index * ROWS_PER_TABLE))
    total = TABLES * table_bytes
    assert writer.max_buffered_bytes is not None and total > 4 * writer.max_buffered_bytes
    assert TABLES * ROWS_PER_TABLE < writer.max_buffered_rows  # the row bound alone would not write anything
    # No flush() and 30 s to the next timed write: what is on disk was written for the bytes bound, a chunk
    # each time the buffer reached it (the table that crosses the bound goes with it).
    expected = TABLES // math.ceil(writer.max_buffered_bytes / table_bytes)
    files = chunks_written(layout.rank_dir(tmp_path / "trial", "kpis", 0), at_least=expected)
    assert len(files) >= expected, \
        f"{len(files)} chunks after {total / 2**20:.1f} MiB put: the writer held it all for its 30-s interval"
    for path in files:  # each chunk: at most the bound plus the one table that crossed it
        rows = pq.read_metadata(path).num_rows
        assert rows * table_bytes / ROWS_PER_TABLE <= writer.max_buffered_bytes + table_bytes, path.name
    writer.close()
    assert writer.error is None
    written = pa.concat_tables(pq.read_table(p) for p in fmt.chunk_files(layout.rank_dir(tmp_path / "trial", "kpis", 0)))
    assert sorted(written["timepoint"].to_pylist()) == list(range(TABLES * ROWS_PER_TABLE))  # nothing lost


def test_no_bytes_bound_keeps_everything_until_the_interval(tmp_path: Path) -> None:
    """``max_buffered_bytes=None`` (benchmarks that cut their own chunks): written at flush() only."""
    writer = ChunkWriter(tmp_path / "trial", flush_seconds=3600, max_buffered_bytes=None, compact_at_close=False)
    for index in range(TABLES):
        writer.put_table("kpis", fat_kpi_table(index * ROWS_PER_TABLE))
    writer.flush()
    files = fmt.chunk_files(layout.rank_dir(tmp_path / "trial", "kpis", 0))
    assert [pq.read_metadata(p).num_rows for p in files] == [TABLES * ROWS_PER_TABLE]
    writer.close()
