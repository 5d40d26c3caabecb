"""The typed packages pass mypy (the house style: types at every public boundary, checked in CI)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_passes_on_the_typed_packages():
    completed = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_mypy_covers_the_app_and_the_cli_too():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    for package in ("src/comgra/service", "src/comgra/server", "src/comgra/cli", "src/comgra/store"):
        assert package in files, files
