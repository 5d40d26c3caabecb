"""The format-3 partition paths: ids that hold ``/``, ``=``, ``%`` or spaces round-trip, and engines read the
partition value back as the id (pyarrow with its default URI segment encoding, DuckDB's hive partitioning)."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from comgra.store import layout

IDS = ["trial_1", "a/b", "lr=0.1", "100%", "with space", "x%2Fy", "ünï", "a,b+c@d~e"]


@pytest.mark.parametrize("trial_id", IDS)
def test_escape_round_trips(trial_id: str) -> None:
    segment = layout.escape_partition_value(trial_id)
    assert "/" not in segment and "=" not in segment
    assert layout.unescape_partition_value(segment) == trial_id


def test_paths(tmp_path: Path) -> None:
    assert layout.partition_dir(tmp_path, "tensors", "lr=0.1", 1) == tmp_path / "tensors" / "trial=lr%3D0.1" / "rank=1"
    assert layout.parse_partition_segment("trial=a%2Fb", "trial") == "a/b"
    assert layout.parse_partition_segment("rank=0", "trial") is None


def test_engines_read_the_ids_back(tmp_path: Path) -> None:
    for number, trial_id in enumerate(IDS):
        folder = layout.partition_dir(tmp_path, "kpis", trial_id, 0)
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"value": [float(number)]}), folder / "c.parquet")
    arrow = ds.dataset(tmp_path / "kpis", partitioning="hive", format="parquet").to_table()
    assert {row["trial"]: row["value"] for row in arrow.to_pylist()} == {t: float(n) for n, t in enumerate(IDS)}
    with duckdb.connect() as con:
        rows = con.execute("SELECT trial, value FROM read_parquet(?, hive_partitioning=true, hive_types_autocast=false)",
                           [str(tmp_path / "kpis" / "**" / "*.parquet")]).fetchall()
    assert {trial: value for trial, value in rows} == {t: float(n) for n, t in enumerate(IDS)}
