"""The KPI summaries of many trials in one engine query (service/run_summaries.py) equal the per-trial summary the
Runs view computed before (``service.runs.kpi_summary``), also with NaN points, a KPI that is all NaN, two ranks at
one timepoint and merged-away parts; a damaged KPI chunk among many trials costs that trial only its fast path."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from comgra.service import RecordingService
from comgra.service.run_summaries import kpi_summaries
from comgra.service.runs import kpi_summary
from comgra.store import format as fmt
from comgra.store.writer import ChunkWriter


def _kpis(rng: np.random.Generator, steps: int, *, nan: float) -> pa.Table:
    values = rng.normal(size=2 * steps)
    values[rng.random(2 * steps) < nan] = np.nan
    return pa.table({"kpi_group": ["loss"] * steps + ["accuracy"] * steps, "kpi_name": ["train"] * steps + ["val"] * steps,
                     "type_of_execution": ["main_execution_type"] * (2 * steps),
                     "timepoint": np.concatenate([np.arange(steps), rng.integers(0, steps, steps)]),
                     "value": values}, schema=fmt.KPIS_SCHEMA)


def _trial(group: Path, trial: str, tables: list[tuple[int, pa.Table]]) -> None:
    directory = fmt.trial_dir(group, trial)
    directory.mkdir(parents=True)
    fmt.write_json_atomic(directory / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION, "trial_id": trial,
                                                       "group": group.name, "created": 1.0, "modules": [],
                                                       "config": {}, "types_of_execution": ["main_execution_type"],
                                                       "finished": 2.0})
    for rank, table in tables:  # each put a chunk of its own, some trials in two ranks
        writer = ChunkWriter(directory, flush_seconds=3600, rank=rank)
        writer.put_table("kpis", table)
        writer.close()


@pytest.fixture
def group(tmp_path: Path) -> Path:
    rng = np.random.default_rng(7)
    root = tmp_path / "sweep"
    for index in range(12):
        tables = [(0, _kpis(rng, 20, nan=0.3 if index % 3 else 0.0))]
        if index % 4 == 1:
            tables.append((1, _kpis(rng, 20, nan=0.1)))  # a second rank, timepoints shared with rank 0
        if index == 5:
            tables.append((0, pa.table({"kpi_group": ["lr"] * 3, "kpi_name": ["all_nan"] * 3,
                                        "type_of_execution": ["main_execution_type"] * 3, "timepoint": [0, 1, 2],
                                        "value": [math.nan] * 3}, schema=fmt.KPIS_SCHEMA)))
        _trial(root, f"trial_{index:02d}", tables)
    return root


def test_one_query_answers_what_each_trials_reader_does(group: Path) -> None:
    service = RecordingService(group)
    try:
        rows = {r.trial: r for r in service.runs().runs}
        assert len(rows) == 12
        for trial, row in rows.items():
            table = service.trial_questions.kpis(trial)
            assert row.kpis == kpi_summary(table), trial
            assert list(row.kpis) == sorted(row.kpis)
            assert row.steps == max(table["timepoint"].to_pylist()) + 1
        assert rows["trial_05"].kpis["lr/all_nan"] == dict.fromkeys(("last", "best", "min", "max"))
    finally:
        service.close()


def test_a_damaged_chunk_costs_its_trial_the_fast_path_only(group: Path) -> None:
    chunk = next((group / "kpis" / "trial=trial_03").rglob("*.parquet"))
    chunk.write_bytes(b"PAR1 not a parquet file")
    files = {t: sorted((group / "kpis" / f"trial={t}").rglob("*.parquet")) for t in ("trial_02", "trial_03")}
    assert kpi_summaries(files) is None  # the one query cannot read them all
    service = RecordingService(group)
    try:
        rows = {r.trial: r for r in service.runs().runs}
        assert len(rows) == 12
        for trial in rows:  # every other trial answered; the damaged one from its reader, which skips the chunk
            assert rows[trial].kpis == kpi_summary(service.trial_questions.kpis(trial)), trial
        assert service.trial_questions.problems("trial_03")  # and says so
    finally:
        service.close()
