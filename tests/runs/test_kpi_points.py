"""Long KPI series: GET /trials/<t>/kpis keeps each bucket's extremes of a 20,000-step curve, all points on asking."""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from comgra.service.kpi_points import extreme_indices

STEPS = 20_000


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    root = tmp_path_factory.mktemp("long") / "store"
    recorder = ComgraRecorder(root, "g", "long", DecisionMakerForRecordingsHardcoded(set()), resource_seconds=None)
    values = np.exp(-np.arange(STEPS) / 5000.0)
    values[12_345] = 50.0  # a spike a plot must keep
    values[777] = math.nan
    for step, value in enumerate(values):
        recorder.record_kpi_in_graph("loss", "train", float(value), timepoint=step,
                                     record_even_if_recording_is_inactive=True)
    recorder.finalize()
    return root / "g"


def test_a_long_curve_is_cut_to_its_extremes_and_comes_whole_on_asking(long_run: Path) -> None:
    from comgra.server.app import create_app

    app = create_app(long_run, warm_up=False)
    client = app.server.test_client()
    try:
        cut = client.get("/api/v1/trials/long/kpis").get_json()
        timings = []
        for _ in range(3):
            started = time.perf_counter()
            client.get("/api/v1/trials/long/kpis")
            timings.append(time.perf_counter() - started)
        whole = client.get("/api/v1/trials/long/kpis", query_string={"max_points": 0}).get_json()
    finally:
        app.server.config.clear()
    assert cut["downsampled"] is True and whole["downsampled"] is False
    assert len(whole["kpis"]) == STEPS
    assert 1000 <= len(cut["kpis"]) <= 2001  # a min and a max per bucket, and the NaN of its bucket
    steps = [k["timepoint"] for k in cut["kpis"]]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == STEPS - 1
    by_step = {k["timepoint"]: k["value"] for k in cut["kpis"]}
    assert by_step[12_345] == 50.0 and by_step[777] is None  # the spike and the NaN (null in JSON) are kept
    assert min(timings) < 1.0  # 0.1 s at load 15 on 2 shared cores; the figure is benchmarks/runs_view.py's


@pytest.mark.parametrize("n", [1, 7, 4001, 20_000])
def test_extreme_indices_keep_every_buckets_min_and_max(n: int) -> None:
    values = np.random.default_rng(n).normal(size=n)
    kept = extreme_indices(values, 100)
    assert len(kept) <= max(n if n <= 100 else 0, 100) and list(kept) == sorted(set(kept))
    assert values.argmax() in kept and values.argmin() in kept
