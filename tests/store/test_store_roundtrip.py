"""Rows written by the chunk writer come back from the reader unchanged (no torch needed)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from comgra.store import TrialReader
from comgra.store import format as fmt
from comgra.store.writer import ChunkWriter

# -- the store alone, without torch -------------------------------------------------------------

NAMES = st.sampled_from(["input", "hidden", "out", "loss", "memory*old"])


@st.composite
def tensor_rows(draw: st.DrawFn) -> list[dict]:
    rows = []
    keys = draw(st.lists(st.tuples(st.integers(0, 50), NAMES, st.sampled_from(["forward", "gradients"]),
                                   st.integers(-1, 3)), min_size=1, max_size=20, unique=True))
    for step, node, kind, iteration in keys:
        neurons = draw(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), max_size=6))
        statistics = draw(st.lists(st.floats(width=32), min_size=len(fmt.STATISTICS), max_size=len(fmt.STATISTICS)))
        rows.append({"training_step": step, "kind": kind, "iteration": iteration, "node": node, "role": node,
                     "tensor_name": node, "tensor_type": "calculated", "aggregation": "mean", "sample": -1,
                     "category": draw(st.none() | st.text(max_size=5)), "shape": [2, len(neurons)],
                     **dict(zip(fmt.STATISTICS, statistics)), "svd_max": float("nan"),
                     "num_neurons": len(neurons), "neurons": neurons})
    return rows


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (np.isnan(a) and np.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@settings(max_examples=25, deadline=None)
@given(tensor_rows(), st.integers(1, 4))
def test_rows_written_in_chunks_read_back_unchanged(rows: list[dict], chunks: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder) / "trial"
        fmt.write_json_atomic(directory / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION})
        writer = ChunkWriter(directory, flush_seconds=60.0)
        for i in range(chunks):
            part = rows[i::chunks]
            if part:
                writer.put_table("tensors", pa.Table.from_pylist(part, schema=fmt.TENSORS_SCHEMA))
            writer.flush()
        writer.close()
        assert writer.error is None
        reader = TrialReader(directory)
        for row in rows:
            found = reader.selection(training_step=row["training_step"], kind=row["kind"],
                                     iteration=row["iteration"], node=row["node"]).to_pylist()
            assert len(found) == 1
            assert all(_same(found[0][k], v if not isinstance(v, float) else float(np.float32(v)))
                       for k, v in row.items() if k != "neurons")
            assert _same(found[0]["neurons"], [float(np.float32(v)) for v in row["neurons"]])
        assert reader.problems == []
        assert not list(directory.rglob(".tmp*"))
