"""The Runs questions of the service over a real recorded sweep: rows, status, filter, sort, groups, changes."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from comgra.errors import ConfigError
from comgra.service import RecordingService
from tests.runs.sweep_recording import CRASHED, GROUP, TRIALS, record_trial


@pytest.fixture
def service(sweep: Path):
    made = RecordingService(sweep)
    yield made
    made.close()


def test_one_row_per_trial_with_hyperparameters_kpis_status_and_steps(service) -> None:
    page = service.runs()
    assert page.total == 4
    rows = {r.trial: r for r in page.runs}
    assert set(rows) == {*TRIALS, CRASHED}
    for trial, (values, losses) in TRIALS.items():
        row = rows[trial]
        assert row.status == "finished"
        assert row.steps == len(losses)
        assert row.hyperparameters == {"lr": values["lr"], "model.width": values["model"]["width"],
                                       "seed": values["seed"], "optimizer": values["optimizer"]}
        assert row.kpis["loss/train"] == {"last": losses[-1], "best": min(losses), "min": min(losses),
                                          "max": max(losses)}
        accuracy = [1 - v for v in losses]
        assert row.kpis["accuracy/val"]["best"] == pytest.approx(max(accuracy))  # higher is better
        assert row.duration is not None and row.duration >= 0
        assert row.findings == {"error": 0, "warning": 0, "info": 0}  # never scanned
    crashed = rows[CRASHED]
    assert (crashed.status, crashed.steps, crashed.duration) == ("crashed", 2, None)
    assert crashed.kpis["loss/train"]["last"] == 3.0


def test_a_recorder_still_open_is_running(service, sweep: Path) -> None:
    recorder = record_trial(sweep.parent, "live_trial", {"lr": 0.5}, [1.0, 2.0], finalize=False)
    try:
        row = next(r for r in service.runs().runs if r.trial == "live_trial")
        assert (row.status, row.steps) == ("running", 2)
        assert row.duration is not None and row.duration > 0
    finally:
        recorder.finalize()
        shutil.rmtree(sweep / "trials" / "live_trial")
        shutil.rmtree(sweep / "hyperparameters" / "trial=live_trial")
    assert "live_trial" not in [r.trial for r in service.runs().runs]


FILTERS = {
    "trial_prefix": ("^lr0\\.1_", ["lr0.1_seed0", "lr0.1_seed1"]),
    "name_equals_value": ("lr=0.01$", ["lr0.01_seed0"]),
    "a_string_value": ("^sgd$", ["lr0.01_seed0"]),
    "nested_name": ("model.width=16", ["lr0.01_seed0"]),
    "nothing": ("no such run", []),
}


@pytest.mark.parametrize(("pattern", "expected"), FILTERS.values(), ids=FILTERS.keys())
def test_the_regex_filter_searches_trial_ids_and_hyperparameter_values(service, pattern, expected) -> None:
    page = service.runs(filter=pattern, sort="trial")
    assert [r.trial for r in page.runs] == sorted(expected)
    assert page.total == len(expected)


def test_sorting_paging_and_missing_values_last(service) -> None:
    best = service.runs(sort="kpis.loss/train.best")
    assert [r.trial for r in best.runs] == ["lr0.1_seed0", "lr0.1_seed1", "lr0.01_seed0", CRASHED]
    worst_first = service.runs(sort="-kpis.loss/train.best", offset=1, limit=2)
    assert [r.trial for r in worst_first.runs] == ["lr0.01_seed0", "lr0.1_seed1"]
    assert worst_first.total == 4
    assert [r.hyperparameters["lr"] for r in service.runs(sort="-hyperparameters.lr").runs] == [1.0, 0.1, 0.1, 0.01]
    assert [r.status for r in service.runs(sort="status").runs] == ["crashed", "finished", "finished", "finished"]
    # A well-formed name that no row has (another sweep's hyperparameter): every row lacks it, the order stays.
    assert service.runs(sort="-hyperparameters.momentum").runs == service.runs().runs


@pytest.mark.parametrize(("kwargs", "named"), [({"filter": "lr=(0.1"}, "filter='lr=\\(0.1' is not a regular"),
                                               ({"sort": "-stpes"}, "sort='-stpes'.*did you mean 'steps'")])
def test_a_bad_filter_or_sort_names_itself_and_the_fix(service, kwargs, named) -> None:
    with pytest.raises(ConfigError, match=named):
        service.runs(**kwargs)


def test_grouping_over_seeds_gives_mean_and_band(service) -> None:
    bands = {b.value: b for b in service.run_group_bands(list(TRIALS), "lr", "loss/train")}
    assert sorted(bands) == [0.01, 0.1]
    seeds = bands[0.1]
    assert sorted(seeds.trials) == ["lr0.1_seed0", "lr0.1_seed1"]
    assert seeds.timepoint == [0, 1, 2, 3]
    assert seeds.mean == pytest.approx([1.1, 0.6, 0.35, 0.4])
    assert seeds.low == pytest.approx([1.0, 0.5, 0.25, 0.3])
    assert seeds.high == pytest.approx([1.2, 0.7, 0.45, 0.5])


def test_saved_findings_are_counted_by_severity(tmp_path: Path, sweep: Path) -> None:
    from comgra.analysis import saved
    from comgra.analysis.findings import Finding, trial_signature

    copy = tmp_path / GROUP
    shutil.copytree(sweep, copy)
    service = RecordingService(copy)
    try:
        trial = "lr0.1_seed0"
        assert next(r for r in service.runs().runs if r.trial == trial).findings["warning"] == 0
        made = [Finding(detector="test", severity=s, score=1.0, trial=trial, node="loss", role=None, kind="forward",
                        training_step=0, message="made by the test") for s in ("warning", "warning", "error")]
        reader = service.trial(trial)
        assert saved.save(reader, trial_signature(reader), service.findings_options, made, [])
        row = next(r for r in service.runs().runs if r.trial == trial)
        assert row.findings == {"error": 1, "warning": 2, "info": 0}
    finally:
        service.close()


def test_a_poll_lists_no_chunks_of_finished_trials(sweep: Path) -> None:
    service = RecordingService(sweep)
    try:
        changes = service.trial_questions.changes
        first = service.data_version()
        service.runs()
        questions = service.run_questions
        made = questions.computed + questions.taken  # computed, or taken from the runs summary an earlier app kept
        for _ in range(3):
            assert service.data_version() == first
            service.runs()
        assert changes.listings == 0  # no writer holds any trial: nothing is listed, ever
        assert questions.computed + questions.taken == made == 4
    finally:
        service.close()
