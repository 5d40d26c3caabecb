"""Plotly figures, built by pure functions from plain data.

Long curves are downsampled for display by keeping the minimum and the maximum
of every bucket (plus the first non-finite value), so a plot of a million
points stays fast in the browser and still shows every spike.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa
import pyarrow.compute as pc

from comgra.service import Series
from comgra.service.kpi_points import extreme_indices
from comgra.server.palette import distinct_colours

MAX_POINTS = 2000
_MARGIN = {"l": 50, "r": 10, "t": 40, "b": 40}


def downsample(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most about ``max_points`` points that keep every bucket's extremes, in x order (service.kpi_points)."""
    if len(x) <= max_points:
        return x, y  # the arrays themselves: nothing to cut, nothing copied
    index = extreme_indices(y, max_points)
    return x[index], y[index]


def empty_figure(message: str) -> go.Figure:
    figure = go.Figure()
    figure.update_layout(
        margin=_MARGIN, height=260, xaxis={"visible": False}, yaxis={"visible": False},
        annotations=[{"text": message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}],
    )
    return figure


# A line of more points than this is drawn without a marker per point. Plotly draws each marker as its own
# SVG element: 2,000 of them (a long run) made Chromium re-layer the page on every frame of every click
# (about 70 ms a click at 1,002 nodes x 50x, from Chromium's trace), and so many markers overlap anyway.
MARKERS_UP_TO = 200


def trial_colour(trial: str, trials: Sequence[str]) -> str:
    """The colour of ``trial`` in every view (series, distributions, KPIs): its place among ``trials``, the
    recording's trials in the order the service lists them, so that a trial looks the same everywhere."""
    order = list(trials)
    return TRIAL_COLOURS[(order.index(trial) if trial in order else len(order)) % len(TRIAL_COLOURS)]


def series_figure(series: Sequence[Series], *, title: str, current_trial: str, current_step: int,
                  trials: Sequence[str] = ()) -> go.Figure:
    """One line per trial, in the trial's colour (and per rank, dashed apart, where ranks are drawn side by
    side); the selected step is marked. ``trials``: the recording's trials (see ``trial_colour``)."""
    if not series:
        return empty_figure("No values of this tensor at other steps.")
    order = list(trials) or list(dict.fromkeys(entry.trial for entry in series))
    figure = go.Figure()
    for entry in series:
        x, y = downsample(entry.steps, entry.values)
        name = entry.trial if entry.rank is None else f"{entry.trial} · rank {entry.rank}"
        mode = "lines+markers" if len(x) <= MARKERS_UP_TO else "lines"
        dash = DASHES[(entry.rank or 0) % len(DASHES)]
        figure.add_trace(go.Scatter(x=x, y=y, mode=mode, name=name, marker={"size": 4},
                                    line={"width": 2.5 if entry.trial == current_trial else 1.2, "dash": dash,
                                          "color": trial_colour(entry.trial, order)}))
    figure.add_vline(x=current_step, line_dash="dot", line_color="#b22222")
    figure.update_layout(title={"text": title, "font": {"size": 13}}, margin=_MARGIN, height=300,
                         xaxis_title="training step", legend={"orientation": "h", "y": -0.25})
    return figure


# Fewer values than this are drawn one marker each: a histogram of 5 values is 5 bars of height 1.
MIN_HISTOGRAM_VALUES = 30


def neuron_figure(values: Sequence[float] | None, *, shape: Sequence[int] = (), total: int | None = None,
                  title: str, has_batch: bool = False) -> go.Figure:
    """The stored values drawn where a drawing means something: a 2-D parameter as a heatmap of its values,
    a few values as one marker each, many as a histogram."""
    if not values:
        return empty_figure("No neuron values for this selection.")
    dimensions = list(shape[1:] if has_batch else shape)
    if len(dimensions) == 2 and min(dimensions) > 1:
        return heatmap_figure(values, dimensions, total=total, title=title)
    if len(values) < MIN_HISTOGRAM_VALUES or len(set(values)) < 8:
        return values_figure(values, title=title)
    return histogram_figure(values, title=title)


def heatmap_figure(values: Sequence[float], dimensions: Sequence[int], *, total: int | None, title: str) -> go.Figure:
    """A matrix's stored values in their places; where the recorder kept only the first values, the whole rows
    among them (the caption says how many)."""
    rows, columns = int(dimensions[0]), int(dimensions[1])
    whole_rows = min(rows, len(values) // columns)
    if whole_rows == 0:
        return values_figure(values, title=title)
    matrix = np.asarray(values[: whole_rows * columns], dtype=np.float64).reshape(whole_rows, columns)
    finite = matrix[np.isfinite(matrix)]
    limit = float(np.abs(finite).max()) if finite.size else 1.0
    figure = go.Figure(go.Heatmap(z=matrix.tolist(), colorscale="RdBu", zmid=0, zmin=-limit, zmax=limit,
                                  hovertemplate="row %{y}, column %{x}: %{z:.6g}<extra></extra>"))
    shown = f"rows 0-{whole_rows - 1} of {rows} (the values the recorder kept)" if whole_rows < rows else \
        f"{rows} × {columns}"
    figure.update_layout(title={"text": f"{title}<br><sup>{shown}</sup>", "font": {"size": 13}}, margin=_MARGIN,
                         height=max(260, min(520, 40 + 12 * whole_rows)), xaxis_title="column", yaxis_title="row",
                         yaxis={"autorange": "reversed", "dtick": 1 if whole_rows <= 20 else None},
                         xaxis={"dtick": 1 if columns <= 20 else None})
    return figure


def values_figure(values: Sequence[float], *, title: str) -> go.Figure:
    """One marker per stored value, by index: for a handful of values, where a histogram says nothing."""
    figure = go.Figure(go.Scatter(x=list(range(len(values))), y=list(values), mode="markers",
                                  marker={"size": 8, "color": "#4c72b0"},
                                  hovertemplate="neuron %{x}: %{y:.6g}<extra></extra>"))
    figure.update_layout(title={"text": title, "font": {"size": 13}}, margin=_MARGIN, height=260,
                         xaxis_title="neuron", yaxis_title="value", xaxis={"dtick": 1 if len(values) <= 20 else None})
    return figure


def histogram_figure(values: Sequence[float] | None, *, title: str) -> go.Figure:
    if not values:
        return empty_figure("No neuron values for this selection.")
    figure = go.Figure(go.Histogram(x=list(values), nbinsx=min(40, max(5, len(values) // 2)),
                                    marker_color="#4c72b0"))
    figure.update_layout(title={"text": title, "font": {"size": 13}}, margin=_MARGIN, height=260,
                         xaxis_title="value", yaxis_title="neurons", bargap=0.05)
    return figure


def kpi_figures(table: pa.Table, max_points: int = MAX_POINTS) -> list[tuple[str, go.Figure]]:
    """One figure per KPI group, with a line per (kpi_name, type_of_execution)."""
    if table.num_rows == 0:
        return []
    table = _rank_in_names(table)
    keys = _line_keys(table)
    x_all = table.column("timepoint").to_numpy()
    y_all = table.column("value").to_numpy(zero_copy_only=False).astype(np.float64)
    figures: dict[str, go.Figure] = {}
    for (group, name, type_), rows in keys:
        order = rows[np.argsort(x_all[rows], kind="stable")]
        x, y = downsample(x_all[order], y_all[order], max_points)
        label = name if type_ in ("", None) else f"{name} · {type_}"
        figure = figures.setdefault(group, _kpi_figure(group))
        figure.add_trace(go.Scatter(x=x, y=y, mode="lines", name=label, line={"width": 1.4}))
    return list(figures.items())


def _kpi_figure(group: str) -> go.Figure:
    figure = go.Figure()
    figure.update_layout(title={"text": group or "KPIs", "font": {"size": 14}}, margin=_MARGIN, height=340,
                         xaxis_title="training step", legend={"orientation": "v"})
    return figure


def _rank_in_names(table: pa.Table) -> pa.Table:
    """With several ranks of a torch.distributed run, each rank's KPI gets its own line: "loss · rank 1"."""
    if "rank" not in table.column_names or pc.count_distinct(table["rank"]).as_py() <= 1:
        return table
    names = pc.binary_join_element_wise(table["kpi_name"], pc.cast(table["rank"], pa.string()), " · rank ")
    return table.set_column(table.schema.get_field_index("kpi_name"), "kpi_name", names)


def _line_keys(table: pa.Table) -> list[tuple[tuple[str, str, str], np.ndarray]]:
    """The rows of every (kpi_group, kpi_name, type_of_execution), without a Python loop over rows."""
    columns = ("kpi_group", "kpi_name", "type_of_execution")
    codes = np.zeros(table.num_rows, dtype=np.int64)
    for column in columns:
        encoded = pc.dictionary_encode(table.column(column).combine_chunks())
        size = len(encoded.dictionary) + 1  # one more code for a missing value
        indices = pc.fill_null(encoded.indices, size - 1).to_numpy(zero_copy_only=False).astype(np.int64)
        codes = codes * size + indices
    order = np.argsort(codes, kind="stable")
    _, starts = np.unique(codes[order], return_index=True)
    ends = [*starts[1:], len(order)]
    result = []
    for start, end in zip(starts, ends):
        rows = order[start:end]
        key = tuple(table.column(c)[int(rows[0])].as_py() for c in columns)
        result.append((key, rows))
    return sorted(result, key=lambda item: tuple(str(k) for k in item[0]))


# -- the Graphs tab: KPIs of several trials overlaid ------------------------------------------------------
# Distinct colours for many curves: plotly's ten repeat after ten. plotly's qualitative palettes pooled and
# ordered farthest-first (palette.py), so the first dozen are far apart; past them a curve also gets its own dash.
CURVE_COLOURS = distinct_colours()
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def curve_style(index: int) -> dict[str, str]:
    """The colour and dash of the ``index``-th curve of a figure: unique for the first 300."""
    return {"color": CURVE_COLOURS[index % len(CURVE_COLOURS)], "dash": DASHES[(index // len(CURVE_COLOURS)) % len(DASHES)]}


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: an exponential moving average, debiased at the start; non-finite values are
    kept as they are and skipped by the average. One linear filter over the finite values (no Python loop)."""
    if weight <= 0 or len(values) == 0:
        return values
    from scipy.signal import lfilter  # here, not at the top: the app starts without paying for scipy

    result = np.array(values, dtype=np.float64)
    finite = np.isfinite(result)
    if not finite.any():
        return result
    averaged = lfilter([1 - weight], [1, -weight], result[finite])
    debias = 1 - weight ** np.arange(1, len(averaged) + 1, dtype=np.float64)
    result[finite] = averaged / debias
    return result


@dataclass(frozen=True)
class KpiOptions:
    log_y: bool = False
    smoothing: float = 0.0  # 0 (none) to 0.99
    robust_range: bool = True  # the y-range of the bulk of the values; points beyond are drawn at its edge
    name_filter: str = ""  # only the curves whose name holds this text (case-insensitive)
    x_axis: str = "step"  # X_AXES: the training step, the wall time of each point, or seconds since the first


def robust_range(values: np.ndarray, *, log_y: bool, fence: float = 4.0) -> tuple[float, float] | None:
    """A y-range that holds every value but the far outliers, or None when there are none (plotly's own range is
    right then). Outliers lie more than ``fence`` interquartile ranges beyond the quartiles (Tukey's fences, wide):
    unlike a range of quantiles, one spike among few points cannot stretch it. In log10 units with ``log_y``."""
    finite = values[np.isfinite(values)]
    if log_y:
        finite = np.log10(finite[finite > 0])
    if finite.size < 10:
        return None
    q1, q3 = np.quantile(finite, [0.25, 0.75])
    spread = (q3 - q1) or abs(q3) * 0.1 or 1.0
    inside = finite[(finite >= q1 - fence * spread) & (finite <= q3 + fence * spread)]
    if inside.size == finite.size:
        return None
    low, high = float(inside.min()), float(inside.max())
    pad = (high - low) * 0.05 or spread * 0.05
    return low - pad, high + pad


# TensorBoard's three x-axes; the two by time read the KPI table's wall_time (null in recordings made before it).
X_AXES = {"step": "training step", "wall": "wall time", "relative": "seconds since the trial's first KPI point"}


def kpi_x(table: pa.Table, x_axis: str) -> tuple[np.ndarray, np.ndarray]:
    """The x of each KPI row on ``x_axis`` (seconds for the two by time), and the rows that have one."""
    if x_axis == "step":
        return table.column("timepoint").to_numpy(), np.ones(table.num_rows, dtype=bool)
    times = table.column("wall_time").to_numpy(zero_copy_only=False).astype(np.float64) \
        if "wall_time" in table.column_names else np.full(table.num_rows, np.nan)
    known = np.isfinite(times)
    if x_axis == "relative" and known.any():
        times = times - times[known].min()
    return times, known


def _plotted_x(x: np.ndarray, x_axis: str) -> Any:
    """x as plotly draws it: a date axis for the wall time (milliseconds, UTC), the numbers otherwise."""
    return (np.asarray(x, dtype=np.float64) * 1000).astype("datetime64[ms]") if x_axis == "wall" else x


DEFAULT_TYPE = "main_execution_type"  # the recorder's type_of_execution when none is given: no news in a label
TRIAL_COLOURS = ("#1F77B4", "#D62728", "#2CA02C", "#9467BD", "#FF7F0E", "#8C564B", "#E377C2", "#17BECF",
                 "#7F7F7F", "#BCBD22")
MARKERS = ("circle", "square", "diamond", "cross", "x", "triangle-up", "star", "hexagon")


@dataclass(frozen=True)
class KpiLine:
    trial: str
    label: str  # the curve's name within its trial: the KPI, its type of step where that says something
    x: np.ndarray
    y: np.ndarray


def kpi_overlay_figures(tables: dict[str, pa.Table], options: KpiOptions = KpiOptions(),
                        max_points: int = MAX_POINTS, *, all_trials: Sequence[str] = ()) -> list[tuple[str, go.Figure]]:
    """One figure per KPI group, a line per (trial, kpi_name, type_of_execution): the trials overlaid, each
    trial a colour and each curve a line style (the same curve in every trial), the legend grouped by trial,
    and one x-range for every figure so that their steps line up."""
    lines: dict[str, list[KpiLine]] = {}
    wanted = options.name_filter.strip().lower()
    for trial, table in tables.items():
        if table.num_rows == 0:
            continue
        table = _rank_in_names(table)
        x_all, known = kpi_x(table, options.x_axis)
        y_all = table.column("value").to_numpy(zero_copy_only=False).astype(np.float64)
        for (group, name, type_), rows in _line_keys(table):
            label = name if type_ in ("", None, DEFAULT_TYPE) else f"{name} · {type_}"
            if wanted and wanted not in f"{group} · {label}".lower():  # the figure's title (the group) too
                continue
            rows = rows[known[rows]]
            by_x = rows[np.argsort(x_all[rows], kind="stable")]
            lines.setdefault(group, []).append(KpiLine(trial, label, x_all[by_x], y_all[by_x]))
    steps = [line.x for entries in lines.values() for line in entries if len(line.x)]
    x_range = (float(min(x.min() for x in steps)), float(max(x.max() for x in steps))) if steps else None
    trials = [t for t in tables if any(line.trial == t for entries in lines.values() for line in entries)]
    order = list(all_trials) or trials
    return [(group, _overlay_figure(group, entries, options, max_points, trials=trials, x_range=x_range,
                                    order=order))
            for group, entries in sorted(lines.items())]


def kpi_line_style(trial_index: int, curve_index: int, several: bool) -> dict[str, Any]:
    """One trial: a colour per curve (``curve_style``). Several: the trial's colour, the curve's dash (and past
    six curves a marker), so that the bugged and the fixed trial never look alike."""
    if not several:
        return {"line": curve_style(curve_index)}
    line = {"color": TRIAL_COLOURS[trial_index % len(TRIAL_COLOURS)], "dash": DASHES[curve_index % len(DASHES)]}
    rounds = curve_index // len(DASHES)
    marker = {"symbol": MARKERS[(rounds - 1) % len(MARKERS)], "size": 5} if rounds else None
    return {"line": line, "marker": marker}


def _overlay_figure(group: str, entries: list[KpiLine], options: KpiOptions, max_points: int, *,
                    trials: list[str], x_range: tuple[float, float] | None, order: Sequence[str] = ()) -> go.Figure:
    figure = _kpi_figure(group)
    figure.update_layout(xaxis_title=X_AXES.get(options.x_axis, X_AXES["step"]))
    at = {"step": "step %{x}", "wall": "%{x|%Y-%m-%d %H:%M:%S}"}.get(options.x_axis, "%{x:.1f} s")
    several = len(trials) > 1
    labels = list(dict.fromkeys(line.label for line in entries))
    everything = np.concatenate([line.y for line in entries]) if entries else np.array([])
    bounds = robust_range(everything, log_y=options.log_y) if options.robust_range else None
    for line in entries:
        place = list(order).index(line.trial) if line.trial in order else trials.index(line.trial)
        style = kpi_line_style(place, labels.index(line.label), several)
        colour = style["line"]["color"]
        key = f"{line.trial} · {line.label}" if several else line.label
        legendgroup = line.trial if several else key
        grouping: dict[str, Any] = {"legendgroup": legendgroup}
        if several:
            grouping["legendgrouptitle"] = {"text": line.trial}
        smoothed = smooth(line.y, options.smoothing)
        if options.smoothing > 0:  # the raw curve stays visible, faint, behind the smoothed one
            rx, ry = downsample(line.x, line.y, max_points)
            figure.add_trace(go.Scatter(x=_plotted_x(rx, options.x_axis), y=ry, mode="lines", name=f"{line.label} (raw)", showlegend=False,
                                        opacity=0.25, line={"width": 1, "color": colour}, hoverinfo="skip",
                                        legendgroup=legendgroup))
        sx, sy = downsample(line.x, smoothed, max_points)
        marker = style.get("marker")
        figure.add_trace(go.Scatter(x=_plotted_x(sx, options.x_axis), y=sy, mode="lines+markers" if marker else "lines",
                                    name=line.label, line={"width": 1.6, **style["line"]}, meta=key,
                                    hovertemplate=f"{key}<br>{at}: %{{y:.6g}}<extra></extra>",
                                    **({"marker": marker} if marker else {}), **grouping))
        if bounds is not None:
            _add_outliers(figure, key, line.x, line.y, bounds, options.log_y, colour, legendgroup, options.x_axis, at)
    if options.log_y:
        figure.update_yaxes(type="log")
    if bounds is not None:
        figure.update_yaxes(range=list(bounds))
        figure.update_layout(title={"text": f"{group or 'KPIs'}<br><sup>y-range of the bulk of the values; "
                                            "▲▼ mark points beyond it (hover for the value)</sup>"})
    if x_range is not None:  # every figure of the tab spans the same steps: their x-axes line up
        pad = (x_range[1] - x_range[0]) * 0.02 or 0.5
        figure.update_xaxes(range=_plotted_x(np.array([x_range[0] - pad, x_range[1] + pad]), options.x_axis).tolist())
    # The legend under the plot, a group per trial: the plots keep the width, whatever the names' length.
    legend_rows = len(labels) + 1 if several else -(-len(labels) // 4)  # a column per trial; else 4 a row
    figure.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0, "groupclick": "toggleitem",
                                 "tracegroupgap": 12},
                         height=330 + 17 * min(40, legend_rows), margin={**_MARGIN, "b": 60})
    return figure


def _add_outliers(figure: go.Figure, label: str, x: np.ndarray, y: np.ndarray, bounds: tuple[float, float],
                  log_y: bool, colour: str, legendgroup: str, x_axis: str = "step", at: str = "step %{x}") -> None:
    """Points outside the y-range, drawn on its edge as triangles that point the way they lie."""
    low, high = (10 ** bounds[0], 10 ** bounds[1]) if log_y else bounds
    for mask, edge, symbol in ((y > high, high, "triangle-up"), (y < low, low, "triangle-down")):
        mask &= np.isfinite(y)
        if not mask.any():
            continue
        ox, oy = downsample(x[mask], y[mask])  # a long run can have thousands: keep each bucket's extremes
        figure.add_trace(go.Scatter(
            x=_plotted_x(ox, x_axis), y=np.full(len(ox), edge), mode="markers", name=f"{label} (beyond the range)",
            legendgroup=legendgroup, showlegend=False, customdata=oy,
            marker={"symbol": symbol, "size": 9, "color": colour, "line": {"width": 1, "color": "#222"}},
            hovertemplate=f"{label}<br>{at}: %{{customdata:.6g}}<extra>beyond the range</extra>"))


# -- distributions across steps (TensorBoard's Distributions view) -------------------------------------
BANDS = ((0, 8, 0.12), (1, 7, 0.22), (2, 6, 0.34), (3, 5, 0.48))  # (low, high) columns of PERCENTILES, opacity


def distribution_figure(entries: Sequence[Any], *, title: str, current_step: int | None = None,
                        trials: Sequence[str] = ()) -> go.Figure:
    """One panel per trial, side by side on a shared y-axis: the percentile bands of the stored values
    (0-100, 7-93, 16-84, 31-69), the median, and the exact min and max statistics dotted."""
    from plotly.subplots import make_subplots

    if not entries:
        return empty_figure("No stored values of this tensor across steps.")
    figure = make_subplots(rows=1, cols=len(entries), shared_yaxes=True, horizontal_spacing=0.03,
                           subplot_titles=[e.trial for e in entries])
    for column, entry in enumerate(entries, start=1):
        colour = trial_colour(entry.trial, list(trials) or [e.trial for e in entries])
        x = entry.steps.tolist()
        for low, high, opacity in BANDS:
            figure.add_trace(go.Scatter(x=x, y=entry.percentiles[:, high].tolist(), mode="lines", line={"width": 0},
                                        showlegend=False, hoverinfo="skip", legendgroup=entry.trial), row=1, col=column)
            figure.add_trace(go.Scatter(x=x, y=entry.percentiles[:, low].tolist(), mode="lines", line={"width": 0},
                                        fill="tonexty", fillcolor=_rgba(colour, opacity), showlegend=False,
                                        hoverinfo="skip", legendgroup=entry.trial), row=1, col=column)
        figure.add_trace(go.Scatter(x=x, y=entry.percentiles[:, 4].tolist(), mode="lines+markers", name="median",
                                    line={"color": colour, "width": 1.6}, marker={"size": 4},
                                    legendgroup=entry.trial, showlegend=column == 1,
                                    hovertemplate="step %{x}: median %{y:.4g}<extra>" + entry.trial + "</extra>"),
                         row=1, col=column)
        for name, values in (("min", entry.minimum), ("max", entry.maximum)):
            figure.add_trace(go.Scatter(x=x, y=values.tolist(), mode="lines", name=f"{name} (statistic)",
                                        line={"color": colour, "width": 1, "dash": "dot"}, legendgroup=entry.trial,
                                        showlegend=column == 1,
                                        hovertemplate=f"step %{{x}}: {name} %{{y:.4g}}<extra>{entry.trial}</extra>"),
                             row=1, col=column)
        if current_step is not None:
            figure.add_vline(x=current_step, line={"color": "#b00", "width": 1, "dash": "dot"}, row=1, col=column)
        figure.update_xaxes(title_text="training step", row=1, col=column)
    values = max(e.values_per_step for e in entries)
    figure.update_layout(height=320, margin={**_MARGIN, "t": 60},
                         title={"text": f"{title}<br><sup>bands: percentiles 0-100, 7-93, 16-84, 31-69 of the "
                                        f"{values} stored values per step; dotted: min and max over all values</sup>",
                                "font": {"size": 13}},
                         legend={"orientation": "h", "yanchor": "bottom", "y": 1.08, "x": 1, "xanchor": "right"})
    return figure


def histograms_figure(histograms: Any, *, title: str) -> go.Figure:
    """TensorBoard's Histograms view, a panel per trial: a row per step, a column per bin (the same bins in every
    trial), coloured by how many stored values fall in it."""
    from plotly.subplots import make_subplots

    trials = list(histograms.counts)
    if not trials:
        return empty_figure("No stored values of this tensor across steps.")
    figure = make_subplots(rows=1, cols=len(trials), shared_yaxes=False, horizontal_spacing=0.05,
                           subplot_titles=trials)
    edges = histograms.edges
    centres = ((edges[:-1] + edges[1:]) / 2).tolist()
    top = max(int(c.max(initial=0)) for c in histograms.counts.values()) or 1
    # A category axis ordered by step: one row of equal height per recorded step, however the steps are spaced
    # (on a numeric axis a row spans half the gap to each neighbour, so uneven spacing gives uneven rows).
    steps = sorted({int(s) for trial in trials for s in histograms.steps[trial]})
    for column, trial in enumerate(trials, start=1):
        figure.add_trace(go.Heatmap(
            x=centres, y=[str(int(s)) for s in histograms.steps[trial]], z=histograms.counts[trial].tolist(),
            name=trial, zmin=0,
            zmax=top, colorscale="Blues", showscale=column == 1, xgap=1, ygap=1,
            colorbar={"title": {"text": "values"}, "thickness": 12},
            hovertemplate="step %{y}<br>value ≈ %{x:.4g}<br>%{z} values<extra>" + trial + "</extra>"), row=1, col=column)
        figure.update_xaxes(title_text="value", range=[float(edges[0]), float(edges[-1])], row=1, col=column)
    figure.update_yaxes(title_text="training step", autorange="reversed", row=1, col=1)
    figure.update_yaxes(type="category", categoryorder="array", categoryarray=[str(s) for s in steps],
                        matches="y", automargin=True)
    figure.update_layout(height=340, margin={**_MARGIN, "t": 60}, title={
        "text": f"{title}<br><sup>{len(centres)} bins of width {float(edges[1] - edges[0]):.3g}, the same in every "
                "trial; the colour counts the stored values in a bin</sup>", "font": {"size": 13}})
    return figure


def _rgba(colour: str, opacity: float) -> str:
    red, green, blue = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red}, {green}, {blue}, {opacity})"
