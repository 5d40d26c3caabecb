"""Neuron drawings that mean something, statistic tooltips, and the Graphs tab's overlaid KPI figures."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from comgra.server import figures, panels
from comgra.server.figures import KpiOptions
from comgra.store import format as fmt


# -- the neurons' figure -------------------------------------------------------------------------------------
def test_a_handful_of_values_is_drawn_one_marker_each_not_as_a_histogram():
    figure = figures.neuron_figure([0.5, -1.0, 2.0, 0.25, 3.0], shape=[8, 5], has_batch=True, title="t")
    (trace,) = figure.data
    assert trace.type == "scatter" and list(trace.y) == [0.5, -1.0, 2.0, 0.25, 3.0]


def test_many_values_make_a_histogram():
    values = np.random.default_rng(0).normal(size=200).tolist()
    (trace,) = figures.neuron_figure(values, shape=[8, 200], has_batch=True, title="t").data
    assert trace.type == "histogram" and list(trace.x) == values


def test_a_matrix_is_a_heatmap_of_its_values_in_place():
    values = np.arange(16 * 32, dtype=float).tolist()
    (trace,) = figures.neuron_figure(values, shape=[16, 32], total=512, title="w").data
    assert trace.type == "heatmap"
    assert np.array_equal(np.asarray(trace.z), np.arange(512).reshape(16, 32))


def test_a_matrix_cut_short_by_the_recorder_shows_its_whole_rows_and_says_so():
    values = np.arange(100, dtype=float).tolist()  # the recorder kept the first 100 of 64 x 64
    figure = figures.neuron_figure(values, shape=[64, 64], total=4096, title="w")
    (trace,) = figure.data
    assert np.asarray(trace.z).shape == (1, 64) and "rows 0-0 of 64" in figure.layout.title.text


# -- what a statistic means under an aggregation ---------------------------------------------------------------
@pytest.mark.parametrize("statistic, aggregation, says", [
    ("min", "mean", "the mean over the batch of each sample's min"),
    ("max", "std", "the standard deviation over the batch of each sample's max"),
    ("mean", "abs_max", "the largest absolute value over the batch of each sample's mean"),
    ("min", "sample:3", "the smallest value of sample 3"),
    ("std", "none", "no batch dimension"),
])
def test_each_statistic_says_what_it_is_under_each_aggregation(statistic, aggregation, says):
    assert says in panels.statistic_help(statistic, aggregation)


def test_the_statistics_table_carries_the_tooltips():
    row = {name: 1.0 for name in fmt.STATISTICS}
    table = panels.statistics_table(row, "mean")
    titles = {tr.children[0].children: tr.children[0].title for tr in table.children.children}
    assert titles["min"] == panels.statistic_help("min", "mean") and set(fmt.STATISTICS) <= set(titles)


# -- KPIs of several trials -----------------------------------------------------------------------------------
def kpis(names: list[str], steps: int = 50, spike: tuple[int, float] | None = None) -> pa.Table:
    rows = []
    for index, name in enumerate(names):
        for step in range(steps):
            value = 1.0 + index + 0.01 * step
            if spike is not None and step == spike[0]:
                value = spike[1]
            rows.append({"kpi_group": "loss", "kpi_name": name, "type_of_execution": "train", "timepoint": step,
                         "value": value})
    return pa.Table.from_pylist(rows, schema=fmt.KPIS_SCHEMA)


def test_twelve_curves_of_two_trials_are_overlaid_in_twelve_distinct_looks():
    tables = {"a": kpis([f"l{i}" for i in range(6)]), "b": kpis([f"l{i}" for i in range(6)])}
    ((group, figure),) = figures.kpi_overlay_figures(tables, KpiOptions(robust_range=False))
    assert group == "loss" and len(figure.data) == 12
    assert {trace.name.split(" · ")[0] for trace in figure.data} == {"a", "b"}
    looks = {(trace.line.color, trace.line.dash) for trace in figure.data}
    assert len(looks) == 12 and len({trace.line.color for trace in figure.data}) == 12


def test_styles_stay_distinct_far_beyond_plotlys_ten():
    assert len({tuple(figures.curve_style(i).values()) for i in range(300)}) == 300


def test_one_spike_does_not_flatten_the_rest_and_stays_visible():
    figure = figures.kpi_overlay_figures({"a": kpis(["loss"], spike=(20, 1e6))})[0][1]
    low, high = figure.layout.yaxis.range
    assert low <= 1.0 and 1.49 <= high < 100  # the bulk (1.0 to 1.49) fills the plot
    (outliers,) = [t for t in figure.data if t.marker.symbol == "triangle-up"]
    assert list(outliers.x) == [20] and list(outliers.customdata) == [1e6] and list(outliers.y) == [high]


def test_no_range_is_forced_without_outliers():
    figure = figures.kpi_overlay_figures({"a": kpis(["loss"])})[0][1]
    assert figure.layout.yaxis.range is None and len(figure.data) == 1


def test_log_scale_and_smoothing():
    figure = figures.kpi_overlay_figures({"a": kpis(["loss"])}, KpiOptions(log_y=True, smoothing=0.6))[0][1]
    assert figure.layout.yaxis.type == "log"
    raw, smoothed = figure.data
    assert raw.opacity == 0.25 and raw.showlegend is False
    y = np.asarray(raw.y)
    expected, average, norm = [], 0.0, 0.0
    for value in y:  # an independent exponential moving average, debiased as TensorBoard does
        average, norm = 0.6 * average + 0.4 * value, 0.6 * norm + 0.4
        expected.append(average / norm)
    assert np.allclose(smoothed.y, expected)
