"""A small real sweep (tests/runs/sweep_recording.py), recorded once per session."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from tests.runs.sweep_recording import record_sweep

    return record_sweep(tmp_path_factory.mktemp("runs") / "store")
