"""The first page's request, made the moment the server listens, must not meet a half-imported pandas (issue 34):
the warm-up thread imported it while a request thread's plotly JSON encoder took it from sys.modules (AttributeError:
no pandas.NaT; HTTP 500 on /_dash-layout, seen by benchmarks/app_latency.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
from comgra.examples.tutorial import run_tutorial  # noqa: E402

CHECK = """
import sys
from comgra.server.app import create_app
assert "pandas" not in sys.modules or hasattr(sys.modules["pandas"], "NaT")
app = create_app(sys.argv[1], findings_scan=False)
# What a request served now finds: pandas whole, whatever the warm-up thread is doing.
assert hasattr(sys.modules.get("pandas"), "NaT"), "pandas is not (fully) imported when the app is ready to serve"
print("ok")
"""


def test_pandas_is_whole_when_the_app_is_ready_to_serve(tmp_path: Path) -> None:
    group = run_tutorial(tmp_path, steps=20, min_training_steps_difference=10, progress=False)
    done = subprocess.run([sys.executable, "-c", CHECK, str(group)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
