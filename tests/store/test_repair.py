"""Repair makes a crashed recording exact for plain readers, and never touches a live writer's files."""
from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from comgra.cli.app import _repair_closed_trials, main
from comgra.store import TrialReader
from comgra.store import format as fmt
from comgra.store.repair import repair_group, repair_trial
from comgra.store.writer import ChunkWriter
from comgra.store import layout


def _kpi_rows(points: range) -> pa.Table:
    return pa.table({"kpi_group": ["loss"] * len(points), "kpi_name": [""] * len(points),
                     "type_of_execution": [""] * len(points), "timepoint": list(points),
                     "value": [float(p) for p in points]}, schema=fmt.KPIS_SCHEMA)


def _plain_count(trial_dir: Path, table: str) -> int:
    with duckdb.connect() as connection:
        return connection.execute("SELECT count(*) FROM read_parquet(?)",
                                  [str(layout.rank_dir(trial_dir, table, 0) / "*.parquet")]).fetchone()[0]


def _crashed_trial(group: Path, trial_id: str = "t") -> Path:
    """A trial as a kill leaves it: a temporary file, and a merged chunk beside the parts it was made of."""
    trial_dir = fmt.trial_dir(group, trial_id)
    fmt.write_json_atomic(trial_dir / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION, "trial_id": trial_id})
    parts = trial_dir.parent.parent / "parts"
    writer = ChunkWriter(trial_dir, flush_seconds=60.0, merge_every=4, compact_at_close=False)
    for point in range(4):
        writer.put_table("kpis", _kpi_rows(range(point * 10, point * 10 + 10)))
        writer.flush()
        if point < 3:  # the merge happens at the 4th flush: keep copies of the parts it deletes
            shutil.copytree(layout.rank_dir(trial_dir, "kpis", 0), parts, dirs_exist_ok=True)
    writer.close()
    shutil.copytree(layout.rank_dir(trial_dir, "kpis", 0), parts, dirs_exist_ok=True)
    for part in parts.iterdir():  # put back all parts (not the 4th: it was never a separate file after the merge)
        if not (layout.rank_dir(trial_dir, "kpis", 0) / part.name).exists() and "-l" not in part.name:
            shutil.copy(part, layout.rank_dir(trial_dir, "kpis", 0) / part.name)
    (layout.rank_dir(trial_dir, "kpis", 0) / f".tmp-1-abc-{fmt.chunk_name(99, 5, 5)}.partial").write_bytes(b"PAR1 half a chunk")
    (trial_dir / f".tmp-1-abd-{fmt.TRIAL_META}.partial").write_text('{"format_')
    (layout.rank_dir(trial_dir, "kpis", 0) / "my_own_notes.parquet").write_bytes(b"a user's file, not a chunk")
    return trial_dir


def test_repair_removes_leftovers_and_covered_parts_and_reports_them(tmp_path: Path) -> None:
    trial_dir = _crashed_trial(tmp_path / "group")
    (layout.rank_dir(trial_dir, "kpis", 0) / "my_own_notes.parquet").unlink()  # (a user's file would break the plain glob below)
    assert _plain_count(trial_dir, "kpis") == 70  # 40 rows, 30 of them twice
    assert TrialReader(trial_dir).kpis().num_rows == 40

    (report,) = repair_group(tmp_path / "group")

    assert report.trial_id == "t" and not report.skipped_live
    assert len(report.covered_removed) == 3 and all(p.startswith("kpis/trial=t/rank=0/") for p in report.covered_removed)
    assert sorted(report.temporary_removed) == sorted([f"kpis/trial=t/rank=0/.tmp-1-abc-{fmt.chunk_name(99, 5, 5)}.partial",
                                                       f".tmp-1-abd-{fmt.TRIAL_META}.partial"])
    assert _plain_count(trial_dir, "kpis") == 40
    assert sorted(TrialReader(trial_dir).kpis()["timepoint"].to_pylist()) == list(range(40))
    assert repair_trial(trial_dir).fixed == 0  # a second repair finds nothing


def test_repair_never_deletes_a_file_it_did_not_name(tmp_path: Path) -> None:
    trial_dir = _crashed_trial(tmp_path / "group")
    repair_trial(trial_dir)
    assert (layout.rank_dir(trial_dir, "kpis", 0) / "my_own_notes.parquet").read_bytes() == b"a user's file, not a chunk"


def test_a_trial_with_a_live_writer_is_skipped(tmp_path: Path) -> None:
    trial_dir = _crashed_trial(tmp_path / "group")
    live = ChunkWriter(trial_dir, flush_seconds=60.0, rank=1, compact_at_close=False)  # another rank records into this trial now
    before = sorted(p.name for p in trial_dir.rglob("*"))
    try:
        (report,) = repair_group(tmp_path / "group")
        assert report.skipped_live and "skipped" in report.describe()
        assert sorted(p.name for p in trial_dir.rglob("*")) == before
    finally:
        live.close()
    assert repair_trial(trial_dir).fixed == 5


def test_a_new_writer_repairs_what_a_crashed_writer_of_its_rank_left(tmp_path: Path) -> None:
    trial_dir = _crashed_trial(tmp_path / "group")
    other_rank = layout.rank_dir(trial_dir, "kpis", 0) / f".tmp-7-abe-{fmt.chunk_name(3, 1, 1, rank=2)}.partial"
    other_rank.write_bytes(b"rank 2 may still be writing this")
    writer = ChunkWriter(trial_dir, flush_seconds=60.0, compact_at_close=False)
    writer.close()
    assert len(writer.repaired.covered_removed) == 3 and len(writer.repaired.temporary_removed) == 1
    assert other_rank.exists() and (trial_dir / f".tmp-1-abd-{fmt.TRIAL_META}.partial").exists()


def test_comgra_repair_prints_one_line_per_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _crashed_trial(tmp_path / "group", "a")
    fmt.write_json_atomic(fmt.trial_dir(tmp_path / "group", "b") / fmt.TRIAL_META, {"format_version": 1})
    assert main(["repair", str(tmp_path / "group")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["comgra repair: a: removed 2 temporary file(s) and 3 chunk(s) already merged into another",
                     "comgra repair: b: nothing to repair"]
    assert main(["repair", str(fmt.trial_dir(tmp_path / "group", "a"))]) == 0
    assert capsys.readouterr().out == "comgra repair: a: nothing to repair\n"


def test_comgra_repair_on_a_folder_without_a_recording_exits_2(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repair", str(tmp_path)]) == 2
    assert "holds no comgra recording" in capsys.readouterr().err


def test_the_app_repairs_closed_trials_when_it_opens_a_group(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    trial_dir = _crashed_trial(tmp_path / "group")
    _repair_closed_trials(tmp_path / "group")
    assert "comgra: repaired t: removed 2 temporary file(s)" in capsys.readouterr().err
    assert not list(trial_dir.rglob(".tmp-*"))
