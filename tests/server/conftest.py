"""Fixtures for the app tests without a browser: a tiny synthetic recording per session."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_synthetic():
    """The recording generator in benchmarks/ (not a package), imported by path."""
    if "synthetic_recording" not in sys.modules:
        spec = importlib.util.spec_from_file_location("synthetic_recording", ROOT / "benchmarks" / "synthetic_recording.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["synthetic_recording"] = module
        spec.loader.exec_module(module)
    return sys.modules["synthetic_recording"]


@pytest.fixture(scope="session")
def synthetic():
    return load_synthetic()


@pytest.fixture(scope="session")
def recording(tmp_path_factory, synthetic) -> Path:
    """Two trials, 12 recorded steps each; read-only for the tests that share it."""
    root = tmp_path_factory.mktemp("recording")
    return synthetic.write_recording(root, synthetic.Options(scale=0.05, steps_per_chunk=5))


@pytest.fixture
def fresh_recording(tmp_path, synthetic) -> Path:
    """A recording of one's own, for tests that damage or extend it."""
    return synthetic.write_recording(tmp_path, synthetic.Options(scale=0.02, trials=1, steps_per_chunk=2))
