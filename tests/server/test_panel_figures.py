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


def test_several_trials_are_coloured_by_trial_styled_by_curve_and_grouped_in_the_legend():
    """24 curves, one colour each, made the bugged and the fixed trial look alike (issue 25, item 8)."""
    names = [f"l{i}" for i in range(8)]
    tables = {"a": kpis(names), "b": kpis(names)}
    ((group, figure),) = figures.kpi_overlay_figures(tables, KpiOptions(robust_range=False))
    assert group == "loss" and len(figure.data) == 16
    colour = {trial: {t.line.color for t in figure.data if t.legendgroup == trial} for trial in ("a", "b")}
    assert len(colour["a"]) == len(colour["b"]) == 1 and colour["a"] != colour["b"]  # a colour per trial
    for trial in ("a", "b"):  # a look per curve within a trial, the same look for the same curve in both
        traces = [t for t in figure.data if t.legendgroup == trial]
        assert [t.name for t in traces] == [f"{n} · train" for n in names] and traces[0].legendgrouptitle.text == trial
        assert len({(t.line.dash, t.marker.symbol if t.marker else None) for t in traces}) == len(names)
    looks = {t.name: (t.line.dash, t.marker.symbol) for t in figure.data if t.legendgroup == "a"}
    assert looks == {t.name: (t.line.dash, t.marker.symbol) for t in figure.data if t.legendgroup == "b"}
    assert figure.layout.legend.orientation == "h"  # under the plot: the plot keeps its width


def test_one_trial_keeps_a_colour_per_curve_and_the_default_type_is_not_named():
    table = kpis(["loss", "accuracy"])
    table = table.set_column(table.schema.get_field_index("type_of_execution"), "type_of_execution",
                             pa.array(["main_execution_type"] * table.num_rows))
    ((_, figure),) = figures.kpi_overlay_figures({"a": table}, KpiOptions(robust_range=False))
    assert sorted(t.name for t in figure.data) == ["accuracy", "loss"]  # no "· main_execution_type"
    assert len({t.line.color for t in figure.data}) == 2


def test_every_figure_spans_the_same_steps_and_a_filter_keeps_the_named_curves():
    short = kpis(["loss"], steps=10)
    other = pa.Table.from_pylist([{**row, "kpi_group": "accuracy", "kpi_name": "acc"} for row in
                                  kpis(["acc"], steps=50).to_pylist()], schema=fmt.KPIS_SCHEMA)
    entries = figures.kpi_overlay_figures({"a": pa.concat_tables([short, other])}, KpiOptions(robust_range=False))
    ranges = {group: tuple(figure.layout.xaxis.range) for group, figure in entries}
    assert set(ranges) == {"accuracy", "loss"} and len(set(ranges.values())) == 1  # the x-axes line up
    low, high = ranges["loss"]
    assert low < 0 and high > 49
    filtered = figures.kpi_overlay_figures({"a": pa.concat_tables([short, other])},
                                           KpiOptions(robust_range=False, name_filter="LOS"))
    assert [(group, [t.name for t in figure.data]) for group, figure in filtered] == [("loss", ["loss · train"])]
    # The placeholder's own example: "loss" finds the figure titled loss whatever its curves are called.
    renamed = pa.Table.from_pylist([{**row, "kpi_name": "train"} for row in short.to_pylist()], schema=fmt.KPIS_SCHEMA)
    by_group = figures.kpi_overlay_figures({"a": pa.concat_tables([renamed, other])},
                                           KpiOptions(robust_range=False, name_filter="loss"))
    assert [group for group, _ in by_group] == ["loss"] and len(by_group[0][1].data) >= 1


def test_styles_stay_distinct_far_beyond_plotlys_ten():
    assert len({tuple(figures.curve_style(i).values()) for i in range(300)}) == 300


def test_twelve_curves_of_one_trial_have_twelve_colours_people_tell_apart():
    """Two of twelve curves were the same magenta (Dark24's #DA16FF and #FB00D1: CIEDE2000 about 8, where 10 is
    hard to tell apart on a thin line). Every pair of the twelve drawn colours is now at least 20 apart."""
    from comgra.server.palette import ciede2000, lab

    figure = figures.kpi_overlay_figures({"a": kpis([f"l{i}" for i in range(12)])})[0][1]
    colours = [t.line.color for t in figure.data if t.mode == "lines"]
    assert len(colours) == 12 and len(set(colours)) == 12
    points = lab(colours)
    apart = ciede2000(points[:, None], points[None])
    assert apart[~np.eye(12, dtype=bool)].min() >= 20
    assert ciede2000(lab(["#DA16FF"]), lab(["#FB00D1"]))[0] < 10  # the measure sees the old pair as one colour


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


def test_resource_figures_use_binary_units_and_name_only_sampled_devices():
    from comgra.server.profile_panel import binary_unit, resource_figures

    assert binary_unit(1023) == ("B", 1.0) and binary_unit(1024) == ("KiB", 1024.0)
    assert binary_unit(8 * 1024 ** 3) == ("GiB", float(1024 ** 3))

    def series(source, metric, values):
        return {"source": source, "metric": metric, "value": values, "wall_time": [1.0 + i for i in range(len(values))],
                "training_step": list(range(len(values))), "rank": 0}

    cpu_only = [series("process", "cpu_percent", [5.0, 7.0]), series("machine", "memory_percent", [40.0, 41.0]),
                series("process", "memory_bytes", [3 * 1024 ** 3, 6 * 1024 ** 3])]
    figures = dict(resource_figures(cpu_only))
    assert figures["percent"].layout.title.text == "CPU and memory use (%)"
    assert figures["bytes"].layout.title.text == "Memory (GiB)" and figures["bytes"].layout.yaxis.ticksuffix == " GiB"
    assert list(figures["bytes"].data[0].y) == [3.0, 6.0]
    with_gpu = dict(resource_figures(cpu_only + [series("gpu:0", "utilization_percent", [90.0, 95.0])]))
    assert with_gpu["percent"].layout.title.text == "CPU, GPU and memory use (%)"


def test_the_flame_graph_names_its_root_labels_numbered_children_and_colours_by_name():
    from comgra.server.profile_panel import ALL_MODULES, flame_figure

    def node(name, parent, value):
        return {"name": name, "label": name.rsplit(".", 1)[-1], "parent": parent, "value": value,
                "self_value": value, "calls": 1}

    nodes = [node("encoder", "", 3.0), node("encoder.layers", "encoder", 2.0), node("encoder.layers.0", "encoder.layers", 1.0),
             node("encoder.layers.1", "encoder.layers", 1.0), node("head", "", 1.0)]
    trace = flame_figure(nodes, "forward").data[0]
    parents = dict(zip(trace.ids, trace.parents))
    assert [i for i, p in parents.items() if not p] == [ALL_MODULES]  # one root, named: never a blank band
    assert parents["encoder"] == parents["head"] == ALL_MODULES
    assert dict(zip(trace.ids, trace.values))[ALL_MODULES] == 4.0
    labels = dict(zip(trace.ids, trace.labels))
    assert labels["encoder.layers.0"] == "layers.0" and labels["encoder.layers"] == "layers"
    backward = flame_figure(list(reversed(nodes[2:])), "backward").data[0]  # other modules, another order
    colours = dict(zip(trace.ids, trace.marker.colors))
    assert all(colours[i] == c for i, c in zip(backward.ids, backward.marker.colors))


def test_a_trial_has_one_colour_in_every_view_whichever_trials_are_shown():
    from comgra.service.distributions import Distribution
    from comgra.service.selection import Series

    every = ["bugged", "fixed"]
    steps = np.arange(5)

    def series_colours(shown: list[str]) -> dict[str, str]:
        figure = figures.series_figure([Series(t, steps, steps * 1.0) for t in shown], title="x", current_trial=shown[0],
                                       current_step=0, trials=every)
        return {trace.name: trace.line.color for trace in figure.data}

    def distribution_colours(shown: list[str]) -> dict[str, str]:
        entries = [Distribution(t, steps, np.tile(np.arange(9.0), (5, 1)), steps * 1.0, steps * 1.0, 9) for t in shown]
        figure = figures.distribution_figure(entries, title="x", trials=every)
        return {trace.legendgroup: trace.line.color for trace in figure.data if trace.name == "median"}

    def kpi_colours(shown: list[str]) -> dict[str, str]:
        tables = {t: kpis(["loss", "acc"], steps=5) for t in shown}
        if len(shown) == 1:  # one trial alone: a colour per curve, not per trial
            tables["other"] = kpis(["loss"], steps=5)
        entries = figures.kpi_overlay_figures(tables, KpiOptions(robust_range=False), all_trials=[*every, "other"])
        return {trace.meta.split(" · ")[0]: trace.line.color for _, figure in entries for trace in figure.data
                if trace.meta and trace.meta.split(" · ")[0] in every}

    expected = {t: figures.trial_colour(t, every) for t in every}
    assert expected["bugged"] != expected["fixed"]
    for colours in (series_colours, distribution_colours, kpi_colours):
        assert colours(every) == expected, colours.__name__
        assert colours(["fixed"]) == {"fixed": expected["fixed"]}, colours.__name__  # the bugged trial hidden


def test_resource_legends_and_the_gpu_status_are_plain_words():
    from comgra.server.profile_panel import gpu_sentence, resource_figures, series_label

    assert series_label("process", "memory_bytes") == "Training process: memory in use"
    assert series_label("machine", "cpu_percent", 1) == "Whole machine: CPU (rank 1)"
    assert series_label("gpu:0", "utilization_percent") == "GPU 0: utilisation"
    assert series_label("disk", "read_bytes") == "disk: read"  # an unknown name still loses its unit suffix
    figure = dict(resource_figures([{"source": "process", "metric": "memory_bytes", "value": [1.0], "wall_time": [1.0],
                                     "training_step": [0], "rank": 0}]))["bytes"]
    assert [t.name for t in figure.data] == ["Training process: memory in use"]
    raw = "no GPU: NVML is not available (NVMLError_LibraryNotFound: NVML Shared Library Not Found)"
    assert gpu_sentence(raw) == "No GPU was sampled: no NVIDIA driver was found on the machine that trained. " \
                                "CPU and memory were."
    assert "pip install nvidia-ml-py" in gpu_sentence("no GPU: nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    assert gpu_sentence("2 GPU(s) through NVML") == "GPU: 2 GPU(s) through NVML"


def test_an_unprofiled_trial_says_why_the_profile_tab_is_empty_and_which_call_fills_it():
    from comgra.server.profile_panel import profile_view

    class Unprofiled:
        def flame_graph(self, trial, phase, **steps):
            return []

    message = profile_view(Unprofiled(), "bugged", "forward")["flame"]
    assert "recorded no per-layer forward times" in message.children
    assert "recorder.track_module(name, module, profile=True)" in message.children
