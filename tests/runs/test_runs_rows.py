"""The Runs tab's rows as the server sends them (server/runs_view.py): computed in the app's warm-up over a sweep,
before the tab is opened; the shown KPI statistics only, to 6 significant digits of the store's values."""
from __future__ import annotations

import math
from pathlib import Path

from comgra.server import app as app_module
from comgra.server import runs_view
from comgra.service import RecordingService
from tests.runs.sweep_recording import CRASHED, TRIALS


def test_the_warm_up_computes_every_runs_row_of_a_sweep(sweep: Path) -> None:
    service = RecordingService(sweep)
    try:
        questions = service.run_questions
        assert questions.computed + questions.taken == 0
        app_module._warm_up(service)
        # every trial, the crashed one too (computed, or taken from the runs summary an earlier app kept)
        assert questions.computed + questions.taken == len(TRIALS) + 1
        service.runs()
        assert questions.computed + questions.taken == len(TRIALS) + 1  # the tab's first page: nothing again
    finally:
        service.close()


def test_a_single_trial_warms_up_without_the_runs_rows(sweep: Path, tmp_path: Path) -> None:
    import shutil

    group = tmp_path / sweep.name
    shutil.copytree(sweep, group)
    for trial in [t for t in [*TRIALS, CRASHED] if t != next(iter(TRIALS))]:
        for folder in group.glob(f"*/trial={trial}"):
            shutil.rmtree(folder)
        shutil.rmtree(group / "trials" / trial)
    service = RecordingService(group)
    try:
        app_module._warm_up(service)
        assert service.run_questions.computed == 0  # one trial: no Runs tab to open
    finally:
        service.close()


def test_a_grid_row_holds_the_shown_statistics_to_six_digits(sweep: Path) -> None:
    service = RecordingService(sweep)
    try:
        runs = service.runs().runs
    finally:
        service.close()
    shortened = 0
    for run in runs:
        row = runs_view.grid_row(run)
        kpi_keys = {key for key in row if key.startswith("kpi:")}
        assert kpi_keys == {f"kpi:{name}:{statistic}" for name in run.kpis
                            for statistic in runs_view.SHOWN_STATISTICS}
        for name, statistics in run.kpis.items():
            for statistic in runs_view.SHOWN_STATISTICS:
                exact, sent = statistics[statistic], row[f"kpi:{name}:{statistic}"]
                if exact is None or not math.isfinite(exact):
                    assert sent is exact or (isinstance(sent, float) and math.isnan(sent) and math.isnan(exact))
                else:
                    assert sent == float(f"{exact:.6g}") and math.isclose(sent, exact, rel_tol=1e-5)
                    shortened += sent != exact
        assert {key[3:]: row[key] for key in row if key.startswith("hp:")} == run.hyperparameters  # never rounded
    assert shortened  # e.g. an accuracy of 1 - 0.7 = 0.30000000000000004 goes as 0.3
