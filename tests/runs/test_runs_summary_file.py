"""The group's runs summary (service/runs_summary.py): a fresh service reads the rows it kept instead of every
trial, and never shows a kept row of a trial that changed since (a real recorded sweep, real re-runs)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from comgra.service import RecordingService, runs_summary
from tests.runs.sweep_recording import CRASHED, GROUP, TRIALS, record_trial


def _rows(group: Path) -> tuple[dict[str, dict], int]:
    service = RecordingService(group)
    try:
        rows = {r.trial: r.as_json() for r in service.runs().runs}
        return rows, service.run_questions.computed
    finally:
        service.close()


@pytest.fixture
def group(tmp_path: Path, sweep: Path) -> Path:
    copy = tmp_path / GROUP
    shutil.copytree(sweep, copy)
    runs_summary.path_of(copy).unlink(missing_ok=True)  # as recorded: no app has opened it
    return copy


def test_a_fresh_service_takes_the_kept_rows_and_computes_none(group: Path) -> None:
    first, computed = _rows(group)
    assert computed == 4 and runs_summary.path_of(group).is_file()
    again, computed = _rows(group)
    assert computed == 0  # every row from the one file
    assert again == first
    assert again["lr0.1_seed1"]["kpis"]["loss/train"] == {"last": 0.5, "best": 0.45, "min": 0.45, "max": 1.2}
    assert again["lr0.1_seed1"]["hyperparameters"] == {"lr": 0.1, "model.width": 8, "seed": 1, "optimizer": "adam"}
    assert again[CRASHED]["status"] == "crashed" and again[CRASHED]["steps"] == 2


def test_a_summary_out_of_date_with_a_trial_is_never_shown(group: Path) -> None:
    from comgra.analysis import saved
    from comgra.analysis.findings import Finding, trial_signature

    _rows(group)
    out_of_date = runs_summary.path_of(group).read_bytes()
    # A new run takes an id (new hyperparameters and losses), and another trial's findings are saved.
    record_trial(group.parent, "lr0.1_seed0", {"lr": 0.3, "seed": 7}, [5.0, 4.0, 6.0])
    service = RecordingService(group)
    try:
        reader = service.trial("lr0.01_seed0")
        made = [Finding(detector="test", severity=s, score=1.0, trial="lr0.01_seed0", node="loss", role=None,
                        kind="forward", training_step=0, message="made by the test") for s in ("error", "info")]
        assert saved.save(reader, trial_signature(reader), service.findings_options, made, [])
    finally:
        service.close()
    runs_summary.path_of(group).write_bytes(out_of_date)  # as an app that computed the rows before left it
    rows, computed = _rows(group)
    assert computed == 2  # the re-run trial, and the one whose first saved findings made its analysis folder
    rerun = rows["lr0.1_seed0"]
    assert rerun["hyperparameters"] == {"lr": 0.3, "seed": 7}
    assert rerun["kpis"]["loss/train"] == {"last": 6.0, "best": 4.0, "min": 4.0, "max": 6.0}
    assert rerun["steps"] == 3 and rerun["status"] == "finished"
    assert rows["lr0.01_seed0"]["findings"] == {"error": 1, "warning": 0, "info": 1}
    # and the file now holds the new rows: a third service agrees and computes nothing
    again, computed = _rows(group)
    assert (again, computed) == (rows, 0)


def test_a_running_trial_is_never_kept(group: Path) -> None:
    recorder = record_trial(group.parent, "live_trial", {"lr": 0.5}, [1.0, 2.0], finalize=False)
    try:
        rows, _ = _rows(group)
        assert rows["live_trial"]["status"] == "running"
        assert "live_trial" not in runs_summary.read(group) and set(runs_summary.read(group)) == {*TRIALS, CRASHED}
    finally:
        recorder.finalize()
    rows, computed = _rows(group)
    assert computed == 1
    assert (rows["live_trial"]["status"], rows["live_trial"]["kpis"]["loss/train"]["last"]) == ("finished", 2.0)
    assert runs_summary.read(group)["live_trial"].status == "finished"


@pytest.mark.parametrize("damage", ["garbage", "a_folder"])
def test_a_damaged_or_unwritable_summary_leaves_the_rows_as_computed(group: Path, damage: str) -> None:
    expected, _ = _rows(group)
    path = runs_summary.path_of(group)
    path.unlink()
    if damage == "garbage":
        path.write_bytes(b"PAR1 not a parquet file")
    else:
        path.mkdir()  # nothing can be written there: the app goes on without the file
    rows, computed = _rows(group)
    assert (rows, computed) == (expected, 4)
    kept = runs_summary.read(group)
    assert set(kept) == (set() if damage == "a_folder" else {*TRIALS, CRASHED})  # the garbage was replaced
