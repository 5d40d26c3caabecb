"""Plotly figures, built by pure functions from plain data.

Long curves are downsampled for display by keeping the minimum and the maximum
of every bucket (plus the first non-finite value), so a plot of a million
points stays fast in the browser and still shows every spike.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa
import pyarrow.compute as pc

from comgra.service import Series

MAX_POINTS = 2000
_MARGIN = {"l": 50, "r": 10, "t": 40, "b": 40}


def downsample(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most about ``max_points`` points that keep every bucket's extremes, in x order."""
    n = len(x)
    if n <= max_points:
        return x, y
    buckets = max(1, max_points // 2)
    size = -(-n // buckets)
    padded = np.full(buckets * size, np.nan)
    padded[:n] = y
    grid = padded.reshape(buckets, size)
    finite = np.isfinite(grid)
    low = np.where(finite, grid, np.inf).argmin(1)
    high = np.where(finite, grid, -np.inf).argmax(1)
    offsets = np.arange(buckets) * size
    keep = [offsets + low, offsets + high]
    bad = ~finite & (np.arange(buckets * size).reshape(buckets, size) < n)
    rows_with_bad = bad.any(1)
    keep.append((offsets + bad.argmax(1))[rows_with_bad])
    index = np.unique(np.concatenate(keep))
    index = index[index < n]
    return x[index], y[index]


def empty_figure(message: str) -> go.Figure:
    figure = go.Figure()
    figure.update_layout(
        margin=_MARGIN, height=260, xaxis={"visible": False}, yaxis={"visible": False},
        annotations=[{"text": message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}],
    )
    return figure


def series_figure(series: Sequence[Series], *, title: str, current_trial: str, current_step: int) -> go.Figure:
    """One line per trial (and per rank, where ranks are drawn side by side); the selected step is marked."""
    if not series:
        return empty_figure("No values of this tensor at other steps.")
    figure = go.Figure()
    for entry in series:
        x, y = downsample(entry.steps, entry.values)
        name = entry.trial if entry.rank is None else f"{entry.trial} · rank {entry.rank}"
        figure.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=name, marker={"size": 4},
                                    line={"width": 2.5 if entry.trial == current_trial else 1.2}))
    figure.add_vline(x=current_step, line_dash="dot", line_color="#b22222")
    figure.update_layout(title={"text": title, "font": {"size": 13}}, margin=_MARGIN, height=300,
                         xaxis_title="training step", legend={"orientation": "h", "y": -0.25})
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
