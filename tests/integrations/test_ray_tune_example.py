"""docs/examples/ray_tune_sweep.py as a user runs it: a real Ray Tune sweep (4 trials, a local Ray), every trial in
one group under Tune's trial id with its config as hyperparameters; then ``comgra scan`` and the Runs rows."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray.tune")

from comgra.service import RecordingService

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "ray_tune_sweep.py"
pytestmark = pytest.mark.slow


def test_a_ray_tune_sweep_lands_in_one_group_and_the_runs_view_shows_it(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
           "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    done = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    group = Path(done.stdout.strip().splitlines()[-1])
    assert group == tmp_path.resolve() / "tune_sweep"
    scan = subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", "--path", str(group), "--json"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert scan.returncode in (0, 1), scan.stderr[-3000:]  # 1: something was found
    found = json.loads(scan.stdout)
    service = RecordingService(group)
    try:
        runs = service.runs(sort="hyperparameters.lr").runs
    finally:
        service.close()
    assert len(runs) == 4
    assert len({r.trial.rsplit("_", 1)[0] for r in runs}) == 1  # Tune's ids: one experiment prefix, _00000 ...
    assert sorted((r.hyperparameters["lr"], r.hyperparameters["seed"]) for r in runs) == [
        (0.05, 0), (0.05, 1), (3.0, 0), (3.0, 1)]
    assert {r.hyperparameters["width"] for r in runs} == {16}
    assert all(r.status == "finished" and r.steps == 12 for r in runs)
    assert all(r.kpis["loss/train"]["last"] is not None or r.hyperparameters["lr"] == 3.0 for r in runs)
    items = found["findings"] if isinstance(found, dict) else found
    counted = Counter((f["trial"], f["severity"]) for f in items)
    for run in runs:  # the Runs view counts what the scan saved, by severity
        assert run.findings == {s: counted[(run.trial, s)] for s in ("error", "warning", "info")}
