"""The chunk writer: immutable chunks that appear atomically, named by their step range, live within flush_seconds."""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from comgra.store import TrialReader
from comgra.store import format as fmt
from comgra.store.writer import ChunkWriter
from comgra.store import layout


def _steps_row(step: int) -> pa.Table:
    return pa.Table.from_pylist([{"training_step": step, "type_of_execution": "main", "iteration": 0, "graph": "g",
                                  "batch_size": 1, "kinds": ["forward"], "samples": [], "categories": None,
                                  "wall_time": 0.0}], schema=fmt.STEPS_SCHEMA)


@pytest.fixture
def trial_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "trial"
    fmt.write_json_atomic(directory / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION})
    return directory


def test_rows_become_visible_within_flush_seconds(trial_dir: Path) -> None:
    writer = ChunkWriter(trial_dir, flush_seconds=0.05, compact_at_close=False)
    reader = TrialReader(trial_dir)
    writer.put_table("steps", _steps_row(7))
    deadline = time.monotonic() + 10
    while reader.steps().num_rows == 0:
        assert time.monotonic() < deadline, "not flushed within 10 s"
        time.sleep(0.01)
    assert reader.steps()["training_step"].to_pylist() == [7]
    writer.close()


def test_nothing_is_written_before_flush_seconds_or_flush(trial_dir: Path) -> None:
    writer = ChunkWriter(trial_dir, flush_seconds=60.0, compact_at_close=False)
    writer.put_table("steps", _steps_row(1))
    time.sleep(0.1)
    assert not (layout.rank_dir(trial_dir, "steps", 0)).exists()
    writer.flush()
    assert len(list((layout.rank_dir(trial_dir, "steps", 0)).glob("*.parquet"))) == 1
    writer.close()
    writer.close()  # idempotent


def test_chunks_carry_their_step_range_and_sorted_rows(trial_dir: Path) -> None:
    writer = ChunkWriter(trial_dir, flush_seconds=60.0, compact_at_close=False)
    for step in (5, 3, 9):
        writer.put_table("steps", _steps_row(step))
    writer.flush()
    writer.put_table("steps", _steps_row(12))
    writer.close()
    names = sorted(p.name for p in (layout.rank_dir(trial_dir, "steps", 0)).glob("*.parquet"))
    assert [fmt.step_range_of(name) for name in names] == [(3, 9), (12, 12)]
    assert names == sorted(names, key=lambda n: int(n.split("-")[-1].split(".")[0]))  # names sort by time
    assert not list(trial_dir.rglob(".tmp*"))


def test_files_are_readable_as_the_umask_allows(trial_dir: Path) -> None:
    previous = os.umask(0o022)
    try:
        writer = ChunkWriter(trial_dir, flush_seconds=60.0, compact_at_close=False)
        writer.put_table("steps", _steps_row(0))
        writer.put_json("graphs/g.json", {"nodes": [], "edges": []})
        writer.close()
        fmt.write_json_atomic(trial_dir / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION})
    finally:
        os.umask(previous)
    for path in [*trial_dir.rglob("*.parquet"), *trial_dir.rglob("*.json")]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_failed_write_leaves_no_temporary_file(trial_dir: Path) -> None:
    def failing_write(tmp: Path) -> None:
        tmp.write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        fmt._write_atomic(layout.rank_dir(trial_dir, "steps", 0) / "x.parquet", failing_write)
    assert list((layout.rank_dir(trial_dir, "steps", 0)).iterdir()) == []


def test_tensor_chunks_are_sorted_for_skipping(trial_dir: Path) -> None:
    rows = [{"training_step": 0, "kind": "forward", "iteration": 0, "node": node, "role": node, "tensor_name": node,
             "tensor_type": "calculated", "aggregation": "mean", "sample": -1, "category": None, "shape": [],
             "num_neurons": 0, "neurons": []} for node in ("zeta", "alpha", "mid")]
    writer = ChunkWriter(trial_dir, flush_seconds=60.0, compact_at_close=False)
    writer.put_table("tensors", pa.Table.from_pylist(rows, schema=fmt.TENSORS_SCHEMA))
    writer.close()
    (chunk,) = (layout.rank_dir(trial_dir, "tensors", 0)).glob("*.parquet")
    assert pq.read_table(chunk)["node"].to_pylist() == ["alpha", "mid", "zeta"]


def test_chunks_are_fsynced_before_the_rename_and_the_folder_after(trial_dir: Path, monkeypatch) -> None:
    synced: list[str] = []
    monkeypatch.setattr(fmt, "DURABLE_WRITES", True)
    monkeypatch.setattr(fmt, "_fsync", lambda path, flags: synced.append(path.name))
    fmt.write_parquet_atomic(layout.rank_dir(trial_dir, "steps", 0) / "a.parquet", _steps_row(0))
    assert len(synced) == 2 and fmt.is_temporary(synced[0]) and synced[0].endswith("a.parquet.partial")
    assert synced[1] == "rank=0"  # format 3: GROUP/steps/trial=<id>/rank=<r>/


def test_temporary_files_never_match_the_documented_globs(trial_dir: Path) -> None:
    seen: list[list[str]] = []

    def write(tmp: Path) -> None:
        tmp.write_bytes(b"PAR1 half")
        seen.append([p.name for p in trial_dir.glob("*/*.parquet")] + [p.name for p in trial_dir.glob("*.json")])

    fmt._write_atomic(layout.rank_dir(trial_dir, "steps", 0) / "b.parquet", lambda tmp: (write(tmp), pq.write_table(_steps_row(0), tmp)))
    assert seen == [[fmt.TRIAL_META]]


def test_a_second_writer_of_the_same_rank_never_overwrites_or_hides_the_first(trial_dir: Path) -> None:
    for _ in range(2):  # e.g. a run resumed from step 0 into the same shard
        writer = ChunkWriter(trial_dir, flush_seconds=60.0, merge_every=2, compact_at_close=False)
        for step in range(3):
            writer.put_table("steps", _steps_row(step))
            writer.flush()
        writer.close()
    assert TrialReader(trial_dir).steps()["training_step"].to_pylist() == [0, 0, 1, 1, 2, 2]
