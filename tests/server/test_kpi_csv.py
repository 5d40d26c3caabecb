"""The Graphs tab's CSV export: the KPI table's wall_time column goes with the points where the table has it."""
from __future__ import annotations

import csv
import io

import pyarrow as pa

from comgra.server.kpi_view import kpi_csv
from comgra.store import format as fmt


class Kpis:
    def __init__(self, tables: dict[str, pa.Table]) -> None:
        self.tables = tables

    def kpis(self, trial: str) -> pa.Table:
        return self.tables[trial]


def table(times: list[float | None] | None) -> pa.Table:
    rows = [{"kpi_group": "loss", "kpi_name": "loss", "type_of_execution": "train", "timepoint": step,
             "value": 1.0 / (step + 1)} for step in range(3)]
    if times is None:  # recorded before the KPI table had wall_time
        return pa.Table.from_pylist(rows, schema=fmt.KPIS_SCHEMA)
    schema = pa.schema([*fmt.KPIS_SCHEMA, pa.field("wall_time", pa.float64())])
    return pa.Table.from_pylist([{**row, "wall_time": t} for row, t in zip(rows, times)], schema=schema)


def read(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_the_csv_has_each_points_wall_time_at_full_precision() -> None:
    times = [1765000000.123456, 1765000001.5, 1765000002.25]
    rows = read(kpi_csv(Kpis({"a": table(times)}), ["a"]))
    assert [float(r["wall_time"]) for r in rows] == times
    assert [(int(r["training_step"]), float(r["value"])) for r in rows] == [(0, 1.0), (1, 0.5), (2, 1 / 3)]


def test_an_old_recording_without_times_has_no_wall_time_column_and_a_mixed_one_leaves_the_cell_empty() -> None:
    assert "wall_time" not in kpi_csv(Kpis({"a": table(None)}), ["a"]).splitlines()[0].split(",")
    assert "wall_time" not in kpi_csv(Kpis({"a": table([None, None, None])}), ["a"]).splitlines()[0].split(",")
    rows = read(kpi_csv(Kpis({"old": table(None), "new": table([5.0, 6.0, 7.0])}), ["old", "new"]))
    assert [r["wall_time"] for r in rows] == ["", "", "", "5.0", "6.0", "7.0"]
