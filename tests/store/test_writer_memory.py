"""A merge must not leave the process holding its memory: RSS after the writer is done stays near where it began.

Arrow's allocator keeps freed pages; without handing them back, every merge left RSS at the
high-water mark of the largest merge (a long run's memory then grew in steps at its merges).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from comgra.store import format as fmt
from comgra.store.writer import ChunkWriter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

ROWS = 200_000  # per flush; four flushes make one merge of 800k rows, about 40 MiB of Arrow memory at its peak


def anonymous_rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def kpi_table() -> pa.Table:
    return pa.table({"kpi_group": pa.array(["loss"] * ROWS), "kpi_name": pa.array([""] * ROWS),
                     "type_of_execution": pa.array(["main"] * ROWS), "timepoint": pa.array(range(ROWS)),
                     "value": pa.array([float(i) for i in range(ROWS)])}, schema=fmt.KPIS_SCHEMA)


def test_a_merge_hands_its_memory_back(tmp_path: Path) -> None:
    table = kpi_table()  # built once, before the baseline: the training thread's share stays the same
    writer = ChunkWriter(tmp_path / "trial", flush_seconds=1000, merge_every=4)
    writer.put_table("kpis", table.slice(0, 10))
    writer.flush()  # a first small chunk: the writer thread's own start-up costs are paid before the baseline
    before = anonymous_rss_mib()
    for _ in range(3 + 4 * 3):  # the small chunk and 3 more make one merge, then three merges of 4 big chunks
        writer.put_table("kpis", table)
        writer.flush()
    writer.close()
    assert writer.error is None
    assert len(fmt.chunk_files(tmp_path / "trial" / "kpis")) <= 4  # the merges did happen
    grown = anonymous_rss_mib() - before
    assert grown < 16, f"RSS stayed {grown:.0f} MiB above where it began after the writer closed"
