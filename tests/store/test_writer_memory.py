"""A merge must not leave the process holding its memory: RSS after the writer is done stays near where it began.

The allocators keep freed pages: without handing them back, every merge left RSS at the high-water
mark of the largest merge so far, and a long run's memory grew in steps at its merges.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from comgra.store import format as fmt
from comgra.store.writer import ChunkWriter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads RssAnon, which Linux gives")

ROWS = 200_000  # per flush; four flushes make one merge of 800k rows, about 40 MiB of Arrow memory at its peak
TENSOR_ROWS, NEURONS = 20_000, 32  # per flush; about 4 MiB of neurons, read back by two merges of 4 chunks


def kpi_table() -> pa.Table:
    return pa.table({"kpi_group": pa.array(["loss"] * ROWS), "kpi_name": pa.array([""] * ROWS),
                     "type_of_execution": pa.array(["main"] * ROWS), "timepoint": pa.array(range(ROWS)),
                     "value": pa.array([float(i) for i in range(ROWS)])}, schema=fmt.KPIS_SCHEMA)


def tensor_table() -> pa.Table:
    """Tensor rows as the recorder writes them: 50 nodes a step, each with its first neurons."""
    rng = np.random.default_rng(0)
    nodes = [f"node_{i % 50}" for i in range(TENSOR_ROWS)]
    values = pa.array(rng.standard_normal(TENSOR_ROWS * NEURONS, dtype=np.float32))
    columns = {
        "training_step": pa.array(np.arange(TENSOR_ROWS) // 50, pa.int64()), "kind": [fmt.FORWARD] * TENSOR_ROWS,
        "iteration": pa.array(np.zeros(TENSOR_ROWS, np.int32)), "node": nodes, "role": ["out"] * TENSOR_ROWS,
        "tensor_name": nodes, "tensor_type": ["calculated"] * TENSOR_ROWS, "aggregation": ["mean"] * TENSOR_ROWS,
        "sample": pa.array(np.full(TENSOR_ROWS, -1, np.int32)), "category": [""] * TENSOR_ROWS,
        "shape": pa.array([[8, NEURONS]] * TENSOR_ROWS, pa.list_(pa.int32())),
        "num_neurons": pa.array(np.full(TENSOR_ROWS, NEURONS)),
        "neurons": pa.FixedSizeListArray.from_arrays(values, NEURONS).cast(pa.list_(pa.float32())),
        **{name: pa.array(rng.standard_normal(TENSOR_ROWS, dtype=np.float32))
           for name in (*fmt.STATISTICS, "svd_max")},
    }
    return pa.table({name: columns[name] for name in fmt.TENSORS_SCHEMA.names}, schema=fmt.TENSORS_SCHEMA)


def grown_by_merges(folder: Path, name: str, table: pa.Table, flushes: int, anonymous_resident_mib) -> float:
    """MiB of RSS the writer left behind after ``flushes`` flushes of ``table`` (and their merges of 4)."""
    writer = ChunkWriter(folder, flush_seconds=1000, merge_every=4, compact_at_close=False)
    writer.put_table(name, table.slice(0, 10))
    writer.flush()  # a first small chunk: the writer thread's own start-up costs are paid before the baseline
    before = anonymous_resident_mib()
    for _ in range(flushes):
        writer.put_table(name, table)
        writer.flush()
    writer.close()
    assert writer.error is None
    assert len(fmt.chunk_files(folder / name)) <= 4  # the merges did happen
    return anonymous_resident_mib() - before


def grown_in_a_fresh_process(folder: Path, name: str, flushes: int) -> float:
    """``grown_by_merges`` in a process of its own: the heaps that earlier tests left do not blur the figure."""
    completed = subprocess.run([sys.executable, __file__, str(folder), name, str(flushes)],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return float(completed.stdout)


def test_a_merge_hands_its_memory_back(tmp_path: Path) -> None:
    # the small chunk and 3 more make one merge, then three merges of 4 big chunks
    grown = grown_in_a_fresh_process(tmp_path / "trial", "kpis", 3 + 4 * 3)
    assert grown < 16, f"RSS stayed {grown:.0f} MiB above where it began after the writer closed"


def test_a_merge_of_tensor_chunks_reads_on_the_writer_thread(tmp_path: Path) -> None:
    """Parquet's pre-buffered reads allocate on Arrow's I/O threads, whose heaps keep the pages after the
    merge has freed them (+17 MiB here, where the writer's own reads leave under 3 MiB)."""
    grown = grown_in_a_fresh_process(tmp_path / "trial", "tensors", 3 + 4)
    assert grown < 8, f"RSS stayed {grown:.0f} MiB above where it began after the writer closed"


if __name__ == "__main__":  # grown_in_a_fresh_process
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from process_memory import anonymous_resident_mib

    folder, name, flushes = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    table = kpi_table() if name == "kpis" else tensor_table()  # before the baseline: the caller's share stays
    print(grown_by_merges(folder, name, table, flushes, anonymous_resident_mib))
