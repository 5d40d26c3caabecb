"""A healthy real model, recorded with our recorder and trained normally, gets no finding at warning or above.

A GPT-2 of transformers from a small config (every parameter tracked, every block's sub-layers registered),
trained with Adam on a task it can learn (``benchmarks/healthy_model_scan.py``, smaller here: the benchmark
records 12 blocks, 237 nodes)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

from comgra.analysis import Scanner  # noqa: E402
from comgra.analysis.findings import SEVERITIES  # noqa: E402


def _benchmark():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "healthy_model_scan.py"
    spec = importlib.util.spec_from_file_location("healthy_model_scan", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_gpt2_trained_with_adam_gets_no_warning(tmp_path) -> None:
    healthy = _benchmark()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trained = healthy.record(tmp_path, steps=90, record_every=3, layers=3, width=32, batch=8, seed=0)
    finally:
        torch.set_num_threads(threads)
    assert trained["last_loss"] < 0.7 * trained["first_loss"]  # it learns
    group = tmp_path / healthy.GROUP
    assert healthy.nodes_of(group) > 50
    found = Scanner().scan(group).findings
    loud = [f"{f.detector} {f.node}: {f.message}" for f in found if f.severity != SEVERITIES[-1]]
    assert loud == []
