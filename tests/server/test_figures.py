"""Figures: downsampling keeps the extremes; KPI and series figures have the expected lines."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from comgra.server import figures
from comgra.service import Series
from comgra.store import format as fmt


def test_short_curves_are_not_touched():
    x, y = np.arange(10), np.linspace(0, 1, 10)
    assert figures.downsample(x, y) == (x, y)


def test_downsampling_keeps_every_spike_and_non_finite_value():
    n = 200_000
    x = np.arange(n)
    y = np.sin(x / 1000.0)
    spikes = [17, 50_001, 123_456, n - 1]
    y[spikes] = [50.0, -40.0, 30.0, 99.0]
    y[77_777] = np.nan
    xs, ys = figures.downsample(x, y, max_points=1000)
    assert len(xs) <= 1100
    assert set(spikes) <= set(xs.tolist()) and 77_777 in xs
    assert np.all(np.diff(xs) > 0)
    assert np.nanmax(ys) == 99.0 and np.nanmin(ys) == -40.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=3000),
       st.integers(4, 200))
def test_downsampled_extremes_equal_the_originals(values, max_points):
    y = np.asarray(values, dtype=np.float64)
    x = np.arange(len(y))
    xs, ys = figures.downsample(x, y, max_points=max_points)
    assert ys.max() == y.max() and ys.min() == y.min()
    assert np.array_equal(ys, y[xs])


def kpi_table(rows):
    return pa.Table.from_pylist(rows, schema=fmt.KPIS_SCHEMA)


def test_kpi_figures_have_one_figure_per_group_and_a_line_per_name_and_type():
    rows = [{"kpi_group": g, "kpi_name": n, "type_of_execution": t, "timepoint": i, "value": float(i)}
            for i in range(5) for g, n, t in [("loss", "loss", "a"), ("loss", "loss", "b"), ("acc", "top1", "a")]]
    entries = dict(figures.kpi_figures(kpi_table(rows)))
    assert sorted(entries) == ["acc", "loss"]
    assert sorted(trace.name for trace in entries["loss"].data) == ["loss · a", "loss · b"]
    assert list(entries["acc"].data[0].x) == [0, 1, 2, 3, 4]


def test_kpi_figures_handle_a_missing_type_and_unsorted_time():
    rows = [{"kpi_group": "g", "kpi_name": "n", "type_of_execution": None, "timepoint": t, "value": 1.0}
            for t in (3, 1, 2)]
    ((group, figure),) = figures.kpi_figures(kpi_table(rows))
    assert group == "g" and list(figure.data[0].x) == [1, 2, 3] and figure.data[0].name == "n"


def test_no_kpis_no_figures():
    assert figures.kpi_figures(fmt.KPIS_SCHEMA.empty_table()) == []


def test_series_figure_overlays_trials_and_marks_the_step():
    series = [Series("a", np.array([0, 10]), np.array([1.0, 2.0])), Series("b", np.array([0, 10]), np.array([3.0, 4.0]))]
    figure = figures.series_figure(series, title="t", current_trial="a", current_step=10)
    assert [trace.name for trace in figure.data] == ["a", "b"]
    assert figure.layout.shapes[0].x0 == 10
    assert figures.series_figure([], title="t", current_trial="a", current_step=0).layout.annotations


def test_a_long_series_is_a_line_without_a_marker_per_point():
    """Plotly draws a marker per point as an SVG element each: thousands of them slowed every frame of the page."""
    steps = np.arange(5000)
    long, short = Series("a", steps, np.sin(steps / 50.0)), Series("b", steps[:50], np.cos(steps[:50] / 5.0))
    figure = figures.series_figure([long, short], title="t", current_trial="a", current_step=10)
    assert [trace.mode for trace in figure.data] == ["lines", "lines+markers"]
    assert len(figure.data[0].x) > figures.MARKERS_UP_TO  # still every kept point, on the line
    assert list(figure.data[1].x) == list(range(50))


def test_histogram_of_neurons():
    figure = figures.histogram_figure([0.0, 1.0, 1.5], title="h")
    assert list(figure.data[0].x) == [0.0, 1.0, 1.5]
    assert figures.histogram_figure([], title="h").layout.annotations
