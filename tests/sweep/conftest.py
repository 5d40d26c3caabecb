"""A sweep-shaped group (benchmarks/sweep_groups.py: a small MLP per trial, 10 recorded steps, every seventh trial
with ReLU units that never fire), recorded once per session; tests that write into it take a copy."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

SWEEP_TRIALS = 80


@pytest.fixture(scope="session")
def recorded_sweep(tmp_path_factory, sweep_groups) -> Path:
    return sweep_groups.record_sweep(tmp_path_factory.mktemp("sweep"), SWEEP_TRIALS)


@pytest.fixture
def sweep(recorded_sweep, tmp_path) -> Path:
    """A fresh, never scanned copy of the sweep."""
    copy = tmp_path / recorded_sweep.name
    shutil.copytree(recorded_sweep, copy)
    return copy
