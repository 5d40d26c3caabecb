"""Format 3: migration of formats 1 and 2 (also interrupted), compaction at close and by ``comgra compact``, one type
per column name across tables, and table roots comgra does not know left alone."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from comgra.store import GroupReader, TrialReader, compaction, layout, migrate
from comgra.store import format as fmt
from comgra.store.writer import ChunkWriter

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _answers(trial: TrialReader) -> dict[str, object]:
    """What a user reads of a trial, every route: the small tables, one step's rows, a series."""
    tensors = sorted(map(str, trial.steps_selection([0, 1, 2]).to_pylist()))
    series = trial.series(node="x", role="x", iteration=None, statistic="min").to_pylist()
    return {"steps": trial.steps().to_pylist(), "kpis": trial.kpis().to_pylist(), "notes": trial.notes(),
            "tensors": tensors, "series": sorted(map(str, series)), "ranks": trial.ranks(),
            "runinfo": trial.evidence("runinfo").to_pylist(), "sentinels": trial.evidence("sentinels").to_pylist(),
            "problems": trial.problems}


def _copy(version: int, tmp_path: Path) -> Path:
    group = tmp_path / f"v{version}"
    shutil.copytree(GOLDEN / f"format_v{version}" / "golden_group", group)
    return group


@pytest.mark.parametrize("version", [1, 2])
def test_migrate_rewrites_an_old_recording_as_format_3_with_the_same_answers(version: int, tmp_path: Path) -> None:
    group = _copy(version, tmp_path)
    opened = GroupReader(group)  # a live app's reader, open across the migration
    before = _answers(opened.trial("golden_trial"))
    done = subprocess.run([sys.executable, "-m", "comgra.cli.app", "migrate", str(group)], capture_output=True,
                          text=True, check=True)
    assert f"golden_trial: format {version} -> 3" in done.stdout
    trial = opened.trial("golden_trial")  # opened again: the migration replaced trial.json
    assert trial.format_version == 3
    assert _answers(trial) == before
    assert not any((group / "trials" / "golden_trial" / table).exists() for table in fmt.TABLES)
    for table in ("steps", "tensors", "kpis"):
        files = sorted((group / table).rglob("*.parquet"))
        assert files and all(layout.rank_of_folder(p.parent) is not None for p in files)
        assert len(files) == len(trial.ranks())  # one file per table and rank
    again = subprocess.run([sys.executable, "-m", "comgra.cli.app", "migrate", str(group)], capture_output=True,
                           text=True, check=True)
    assert "golden_trial:" in again.stdout and _answers(GroupReader(group).trial("golden_trial")) == before


def test_a_migration_interrupted_before_its_commit_leaves_the_old_format_readable(tmp_path: Path, monkeypatch) -> None:
    group = _copy(2, tmp_path)
    before = _answers(GroupReader(group).trial("golden_trial"))

    def crash(path: Path, document: dict) -> None:
        raise KeyboardInterrupt("killed at the commit")

    monkeypatch.setattr(fmt, "write_json_atomic", crash)
    with pytest.raises(KeyboardInterrupt):
        migrate.migrate_trial(group / "trials" / "golden_trial")
    monkeypatch.undo()
    assert (group / "tensors").is_dir()  # half done: the new files are there, the commit is not
    trial = GroupReader(group).trial("golden_trial")
    assert trial.format_version == 2 and _answers(trial) == before
    migrate.migrate_trial(group / "trials" / "golden_trial")
    assert _answers(GroupReader(group).trial("golden_trial")) == before


def test_a_migration_interrupted_after_its_commit_reads_as_format_3(tmp_path: Path, monkeypatch) -> None:
    group = _copy(2, tmp_path)
    before = _answers(GroupReader(group).trial("golden_trial"))
    monkeypatch.setattr(migrate, "_remove_old_chunks", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        migrate.migrate_trial(group / "trials" / "golden_trial")
    monkeypatch.undo()
    assert any((group / "trials" / "golden_trial" / "tensors").glob("*.parquet"))  # the old chunks are still there
    trial = GroupReader(group).trial("golden_trial")
    assert trial.format_version == 3 and _answers(trial) == before  # read once, from the new layout
    migrate.migrate_trial(group / "trials" / "golden_trial")
    assert not (group / "trials" / "golden_trial" / "tensors").exists()


def _kpi(step: int) -> pa.Table:
    return pa.table({"kpi_group": ["loss"], "kpi_name": [""], "type_of_execution": [""], "timepoint": [step],
                     "value": [float(step)]}, schema=fmt.KPIS_SCHEMA)


def _trial(tmp_path: Path) -> Path:
    directory = fmt.trial_dir(tmp_path / "group", "lr=0.1 a%b")
    fmt.write_json_atomic(directory / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION})
    return directory


def test_a_closing_writer_leaves_one_file_per_table(tmp_path: Path) -> None:
    directory = _trial(tmp_path)
    writer = ChunkWriter(directory, merge_every=4)
    for step in range(23):  # 23 flushes: tiers of 4 leave 1 + 1 + 3 files before the close
        writer.put_table("kpis", _kpi(step))
        writer.flush()
    writer.close()
    assert writer.error is None
    assert len(fmt.chunk_files(layout.rank_dir(directory, "kpis", 0))) == 1
    assert TrialReader(directory).kpis()["timepoint"].to_pylist() == list(range(23))


def test_compaction_cuts_files_past_the_target_size_and_keeps_every_row_once(tmp_path: Path) -> None:
    directory = _trial(tmp_path)
    writer = ChunkWriter(directory, merge_every=1000, compact_at_close=False)
    for step in range(12):
        writer.put_table("kpis", _kpi(step))
        writer.flush()
    writer.close()
    folder = layout.rank_dir(directory, "kpis", 0)
    size = max(p.stat().st_size for p in fmt.chunk_files(folder))
    report = compaction.compact_folder(folder, "kpis", target_bytes=4 * size)
    assert (report.before, report.after) == (12, 3)
    assert len(fmt.chunk_files(folder)) == 3
    assert TrialReader(directory).kpis()["timepoint"].to_pylist() == list(range(12))


def test_comgra_compact_compacts_finished_trials_and_skips_a_live_one(tmp_path: Path) -> None:
    directory = _trial(tmp_path)
    writer = ChunkWriter(directory, merge_every=1000, compact_at_close=False)
    for step in range(5):
        writer.put_table("kpis", _kpi(step))
        writer.flush()
    live = subprocess.run([sys.executable, "-m", "comgra.cli.app", "compact", str(directory.parent.parent)],
                          capture_output=True, text=True, check=True)
    assert "skipped, a writer is recording it now" in live.stdout
    assert len(fmt.chunk_files(layout.rank_dir(directory, "kpis", 0))) == 5
    writer.close()
    done = subprocess.run([sys.executable, "-m", "comgra.cli.app", "compact", str(directory.parent.parent)],
                          capture_output=True, text=True, check=True)
    assert "lr=0.1 a%b: 5 file(s) -> 1" in done.stdout
    assert TrialReader(directory).kpis()["timepoint"].to_pylist() == list(range(5))


def test_a_step_recorded_twice_keeps_its_steps_chunks_apart(tmp_path: Path) -> None:
    directory = _trial(tmp_path)
    row = {"training_step": 0, "type_of_execution": "main", "iteration": 0, "graph": "g", "batch_size": 1,
           "kinds": [], "samples": [], "categories": [], "wall_time": 0.0}
    writer = ChunkWriter(directory, compact_at_close=False)
    for _ in range(2):  # a resumed run records step 0 again: both records are kept
        writer.put_table("steps", pa.Table.from_pylist([row], schema=fmt.STEPS_SCHEMA))
        writer.flush()
    writer.close()
    report = compaction.compact_folder(layout.rank_dir(directory, "steps", 0), "steps")
    assert report.after == 2 and "resumed" in report.skipped
    assert TrialReader(directory).steps().num_rows == 2


def test_a_column_name_has_one_type_across_every_table() -> None:
    types: dict[str, pa.DataType] = {}
    for table, schema in fmt.FILE_SCHEMAS.items():
        assert "rank" not in schema.names and "trial" not in schema.names, table
        for field in schema:
            assert types.setdefault(field.name, field.type) == field.type, (table, field.name)


def test_reader_and_repair_leave_table_roots_they_do_not_know_alone(tmp_path: Path) -> None:
    directory = _trial(tmp_path)
    writer = ChunkWriter(directory)
    writer.put_table("kpis", _kpi(0))
    writer.close()
    group = directory.parent.parent
    foreign = layout.partition_dir(group, "findings", directory.name, 0) / fmt.chunk_name(0, 0, 0)
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"another tool's table")
    temporary = foreign.parent / f".tmp-1-abc-{foreign.name}.partial"
    temporary.write_bytes(b"half")
    from comgra.store.repair import repair_group

    repair_group(group)
    assert foreign.exists() and temporary.exists()
    trial = GroupReader(group).trial(directory.name)
    assert trial.kpis().num_rows == 1 and trial.problems == []
