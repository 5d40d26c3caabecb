"""The Runs tab: one row per trial of a sweep, as TensorBoard's runs table and W&B's runs view show them.

A virtualised table (dash-ag-grid: only the rows in view are in the page, so 1,000 trials sort and
filter in the browser) with each trial's hyperparameters, the last/best/min of each KPI, its findings
by severity, status, steps and duration. The regex filter runs in the browser over the trial ids and
hyperparameter values (``name=value`` too), as ``GET /api/v1/runs?filter=`` does on the server.
Below the table: a KPI's mean and min/max band over the trials of each value of a hyperparameter
(seeds), and a parallel-coordinates plot of the hyperparameters against a KPI, drawn when asked ("Draw the
plots") and then following the filter. Ticked trials open in
the Graphs tab (overlaid) or in Compare (the first beside the second). The data questions are
``RecordingService.runs`` and ``run_group_bands``; the figures are pure functions of their answers.
"""
from __future__ import annotations

import json
import math
from typing import Any

import dash_ag_grid as dag
import numpy as np
import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html, no_update
from dash.development.base_component import Component

from comgra.errors import ComgraError
from comgra.server import kpi_view
from comgra.service import RecordingService
from comgra.service.runs import SEVERITIES, GroupBand, Run

SHOWN_STATISTICS = ("last", "best", "min")  # per KPI in the table; max is in the REST answer and the plots
ROW_DIGITS = 6  # significant digits of a KPI's value in the table's rows
# The plots are drawn when asked ("Draw the plots"), then follow the filter: a parallel-coordinates plot (WebGL) held
# the browser's main thread 4-8 s per draw in Chromium without a GPU at load 20, of 40 trials as of 1,000, and the
# filter and sorting of the table waited for it.
_MARGIN = {"l": 60, "r": 20, "t": 40, "b": 40}
PLOTS_WAITING = ("Press 'Draw the plots' to draw a KPI's mean and band per group and the parallel coordinates of the "
                 "trials shown.")


class ID:
    FILTER = "runs-filter"
    FILTER_NOTICE = "runs-filter-notice"
    COUNT = "runs-count"
    SHOWN = "runs-shown"  # dcc.Store: the trial ids the filter lets through (assets/runs.js), which the plots show
    GRID = "runs-grid"
    GROUP_BY = "runs-group-by"
    KPI = "runs-kpi"
    BANDS = "runs-bands"
    PARALLEL = "runs-parallel"
    OPEN_GRAPHS = "runs-open-graphs"
    OPEN_COMPARE = "runs-open-compare"
    DRAW = "runs-draw"
    PLOTS = "runs-plots"
    MESSAGE = "runs-message"


def panel(service: RecordingService | None = None) -> html.Div:
    """The tab's panel; with ``service``, its table filled (the rows come with the tab's first answer: no second
    request for them after the panel is drawn)."""
    row_data, columns, names, kpis, chosen, message = table(service, None) if service is not None else \
        ([], [], [], [], None, "")
    return html.Div(className="runs-panel", children=[
        dcc.Store(id=ID.SHOWN, data=None),
        html.Div(className="d-flex flex-wrap align-items-end gap-3 mb-2", children=[
            html.Div(className="selector runs-filter", children=[
                html.Label("Filter runs (regex over trial ids and hyperparameters)", htmlFor=ID.FILTER,
                           className="form-label"),
                dcc.Input(id=ID.FILTER, type="search", value="", placeholder="e.g. lr=0\\.01 or ^sweep_a", debounce=False,
                          className="form-control form-control-sm", style={"minWidth": "320px"})]),
            html.Span(id=ID.COUNT, className="text-muted small runs-count", role="status"),
            html.Button("Open ticked in Graphs", id=ID.OPEN_GRAPHS, className="btn btn-outline-primary btn-sm",
                        title="Overlay the KPIs of the ticked trials in the Graphs tab"),
            html.Button("Open ticked in Compare", id=ID.OPEN_COMPARE, className="btn btn-outline-primary btn-sm",
                        title="Show the first ticked trial in the Tensors tab and compare the second with it"),
        ]),
        html.Div(id=ID.FILTER_NOTICE, className="selector-notice small", role="status"),
        html.Div(message, id=ID.MESSAGE, className="selector-notice small", role="status"),
        dag.AgGrid(id=ID.GRID, rowData=row_data, columnDefs=columns, className="ag-theme-alpine runs-grid",
                   style={"height": "420px", "width": "100%"},
                   defaultColDef={"sortable": True, "resizable": True, "filter": False, "minWidth": 90},
                   dashGridOptions={"rowSelection": "multiple", "suppressFieldDotNotation": True,
                                    "suppressRowClickSelection": True, "animateRows": False,
                                    "rowBuffer": 10, "suppressColumnVirtualisation": True,
                                    # assets/runs.js: the regex filter, run by the grid over the rows it holds
                                    "isExternalFilterPresent": {"function": "comgraRunsPresent()"},
                                    "doesExternalFilterPass": {"function": "comgraRunsPasses(params.data)"}},
                   getRowId="params.data.trial"),
        html.Div(className="d-flex flex-wrap align-items-end gap-3 mt-3", children=[
            html.Div(className="selector runs-group-by", style={"minWidth": "220px"}, children=[
                html.Label("Group by hyperparameter (mean and band over the group)", htmlFor=ID.GROUP_BY,
                           className="form-label"),
                dcc.Dropdown(id=ID.GROUP_BY, options=names, clearable=True, placeholder="e.g. lr")]),
            html.Div(className="selector runs-kpi", style={"minWidth": "260px"}, children=[
                html.Label("KPI", htmlFor=ID.KPI, className="form-label"),
                dcc.Dropdown(id=ID.KPI, options=kpis, value=chosen, clearable=False, placeholder="a KPI")]),
            html.Button("Draw the plots", id=ID.DRAW, className="btn btn-outline-primary btn-sm",
                        title="Draw the mean and band per group and the parallel coordinates of the trials shown; "
                              "once drawn, they follow the filter"),
        ]),
        # The plots' graphs are made when first asked for (``plots_shown``): a graph in the panel loads plotly.js, whose
        # parsing held the browser's main thread 2-3 s while the table's first rows waited, on a loaded machine.
        html.Div(id=ID.PLOTS, className="runs-plots", children=html.P(PLOTS_WAITING, className="text-muted small")),
    ])


def plots_shown() -> list[Component]:
    """The plots below the table, made when 'Draw the plots' is first pressed."""
    return [dcc.Graph(id=ID.BANDS, config={"displaylogo": False}),
            dcc.Graph(id=ID.PARALLEL, config={"displaylogo": False})]


def validation_panel() -> html.Div:
    """The panel with its plots made (what Dash checks the callbacks against)."""
    built = panel()
    built.children[-1].children = plots_shown()
    return built


def table(service: RecordingService, kpi: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str],
                                                       list[str], str | None, str]:
    """The grid's rows and columns, the hyperparameters and KPIs to choose from, the KPI chosen (``kpi`` if the
    rows have it) and the message above the table."""
    try:
        runs = service.runs().runs
    except ComgraError as error:
        return [], [], [], [], None, str(error)
    kpis = sorted({k for r in runs for k in r.kpis})
    names = sorted({n for r in runs for n in r.hyperparameters})
    chosen = kpi if kpi in kpis else (kpis[0] if kpis else None)
    message = "" if runs else "This recording has no trials yet."
    return [grid_row(r) for r in runs], column_defs(runs), names, kpis, chosen, message


# -- pure builders ------------------------------------------------------------------------------------
def grid_row(run: Run) -> dict[str, Any]:
    """A run as the grid's row: flat keys (``hp:<name>``, ``kpi:<name>:<statistic>`` of the statistics shown, to
    ``ROW_DIGITS`` significant digits), and ``_search``, the texts the browser's regex filter searches (the trial
    id, each value and each ``name=value``). The exact numbers are in ``GET /api/v1/runs``."""
    row: dict[str, Any] = {"trial": run.trial, "status": run.status, "steps": run.steps,
                           "duration": None if run.duration is None else round(run.duration, 1)}
    search = [run.trial]
    for name, value in run.hyperparameters.items():
        row[f"hp:{name}"] = value
        text = "None" if value is None else value if isinstance(value, str) else _json_text(value)
        search += [text, f"{name}={text}"]
    for name, statistics in run.kpis.items():
        for statistic in SHOWN_STATISTICS:  # the columns shown only, each to ROW_DIGITS significant digits
            row[f"kpi:{name}:{statistic}"] = _rounded(statistics.get(statistic))
    for severity in SEVERITIES:
        row[f"findings:{severity}"] = run.findings.get(severity, 0)
    row["_search"] = search
    return row


def _rounded(value: Any) -> Any:
    """A KPI's value as the grid needs it: 6 significant digits (it shows 4 and sorts by these), a third of the
    row data of 1,000 trials less than the 17 digits of a float; anything else as it is."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.{ROW_DIGITS}g}")
    return value


def column_defs(runs: list[Run]) -> list[dict[str, Any]]:
    names = sorted({n for r in runs for n in r.hyperparameters})
    kpis = sorted({k for r in runs for k in r.kpis})
    number = {"type": "rightAligned", "valueFormatter": {"function": "params.value == null ? '' : "
                                                          "(typeof params.value === 'number' ? "
                                                          "Number(params.value.toPrecision(4)).toString() : "
                                                          "String(params.value))"}}
    return [
        {"field": "trial", "headerName": "Trial", "pinned": "left", "checkboxSelection": True,
         "headerCheckboxSelection": True, "headerCheckboxSelectionFilteredOnly": True, "minWidth": 180},
        {"field": "status", "headerName": "Status"},
        {"field": "steps", "headerName": "Steps", **number},
        {"field": "duration", "headerName": "Duration (s)", **number},
        {"headerName": "Hyperparameters", "children": [{"field": f"hp:{n}", "headerName": n, **number}
                                                       for n in names]},
        *[{"headerName": k, "children": [{"field": f"kpi:{k}:{s}", "headerName": s, **number}
                                         for s in SHOWN_STATISTICS]} for k in kpis],
        {"headerName": "Findings", "children": [{"field": f"findings:{s}", "headerName": s, **number}
                                                for s in SEVERITIES]},
    ]


def band_figure(bands: list[GroupBand], *, by: str, kpi: str) -> go.Figure:
    """One line (the mean) and a shaded min-max band per value of ``by``."""
    figure = go.Figure()
    for index, group in enumerate(bands):
        if not group.timepoint:
            continue
        colour = _COLOURS[index % len(_COLOURS)]
        label = f"{by}={group.value} ({len(group.trials)} trials)"
        figure.add_trace(go.Scatter(x=group.timepoint + group.timepoint[::-1], y=group.high + group.low[::-1],
                                    fill="toself", fillcolor=_fade(colour), line={"width": 0}, hoverinfo="skip",
                                    showlegend=False, legendgroup=label))
        figure.add_trace(go.Scatter(x=group.timepoint, y=group.mean, mode="lines", name=label, legendgroup=label,
                                    line={"color": colour},
                                    hovertemplate=f"{label}<br>step %{{x}}: mean %{{y:.6g}}<extra></extra>"))
    figure.update_layout(title=f"{kpi}: mean and min-max over each {by}", margin=_MARGIN, height=360,
                         xaxis_title="training step", yaxis_title=kpi)
    return figure


def parallel_figure(runs: list[Run], kpi: str, statistic: str = "best") -> go.Figure:
    """W&B's parallel coordinates: one axis per hyperparameter (strings as categories), the KPI last, lines
    coloured by it. Trials without the KPI are left out."""
    chosen = [r for r in runs if r.kpis.get(kpi, {}).get(statistic) is not None]
    if not chosen:
        return _empty(f"No trial has {kpi} yet.")
    dimensions = []
    for name in sorted({n for r in chosen for n in r.hyperparameters}):
        values = [r.hyperparameters.get(name) for r in chosen]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None):
            numbers = np.array([np.nan if v is None else float(v) for v in values])
            dimensions.append({"label": name, "values": numbers})
        else:
            texts = sorted({str(v) for v in values})
            dimensions.append({"label": name, "values": [texts.index(str(v)) for v in values],
                               "tickvals": list(range(len(texts))), "ticktext": texts})
    target = [r.kpis[kpi][statistic] for r in chosen]
    dimensions.append({"label": f"{kpi} ({statistic})", "values": target})
    figure = go.Figure(go.Parcoords(line={"color": target, "colorscale": "Viridis", "showscale": True},
                                    dimensions=dimensions))
    figure.update_layout(title=f"Hyperparameters against {kpi} ({statistic}), {len(chosen)} trials",
                         margin={"l": 80, "r": 80, "t": 80, "b": 30}, height=380)
    return figure


def _empty(message: str) -> go.Figure:
    figure = go.Figure()
    figure.update_layout(margin=_MARGIN, height=200, xaxis={"visible": False}, yaxis={"visible": False},
                         annotations=[{"text": message, "showarrow": False, "xref": "paper", "yref": "paper",
                                       "x": 0.5, "y": 0.5}])
    return figure


_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf")


def _fade(colour: str) -> str:
    red, green, blue = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},0.2)"


def _json_text(value: Any) -> str:
    return json.dumps(value)


# -- callbacks ------------------------------------------------------------------------------------------
# The browser's filter (assets/runs.js): typing is handled there, outside Dash's callbacks (no request, no new
# rowData); this callback applies the filter to new rows (the tab opened, a poll) and says the count. An invalid
# regex shows all rows and says why.
_ROWS_JS = """
function(rows, text) {
    const runs = window.comgraRuns;
    runs.rows = rows || [];
    const notice = runs.compile(text);
    const passing = runs.passing();
    const api = runs.grid();
    if (api) { api.onFilterChanged(); }
    const changed = runs.changedShown(passing);
    return [notice, runs.count(passing), changed === null ? window.dash_clientside.no_update : changed];
}
"""


def register(app: Dash, service: RecordingService, *, tabs: str, data_version: str, trial_select: str) -> None:
    @app.callback(Output(ID.GRID, "rowData"), Output(ID.GRID, "columnDefs"), Output(ID.GROUP_BY, "options"),
                  Output(ID.KPI, "options"), Output(ID.KPI, "value"), Output(ID.MESSAGE, "children"),
                  Input(tabs, "active_tab"), Input(data_version, "data"), State(ID.KPI, "value"),
                  prevent_initial_call=True)  # the panel is built with its rows (``panel``): not again as it appears
    def rows(active: str, _version: Any, kpi: Any) -> Any:
        if active != "runs":
            return (no_update,) * 6
        return table(service, kpi)

    app.clientside_callback(_ROWS_JS, Output(ID.FILTER_NOTICE, "children"), Output(ID.COUNT, "children"),
                            Output(ID.SHOWN, "data"), Input(ID.GRID, "rowData"), State(ID.FILTER, "value"))

    @app.callback(Output(ID.PLOTS, "children"), Input(ID.DRAW, "n_clicks"), State(ID.PLOTS, "children"),
                  prevent_initial_call=True)
    def make_plots(asked: Any, shown: Any) -> Any:
        made = isinstance(shown, list) and any(isinstance(c, dict) and c.get("type") == "Graph" for c in shown)
        return plots_shown() if asked and not made else no_update

    @app.callback(Output(ID.BANDS, "figure"), Output(ID.PARALLEL, "figure"), Input(ID.GROUP_BY, "value"),
                  Input(ID.KPI, "value"), Input(ID.SHOWN, "data"), Input(ID.DRAW, "n_clicks"),
                  State(tabs, "active_tab"))
    def plots(by: Any, kpi: Any, shown: Any, asked: Any, active: str) -> Any:
        if active != "runs" or not kpi:
            return _empty("Choose a KPI."), _empty("Choose a KPI.")
        trials = [str(trial) for trial in shown or []]
        if not asked:
            waiting = _empty(f"Press 'Draw the plots' to draw them for the {len(trials)} trials shown.")
            return waiting, waiting
        wanted = set(trials)
        runs = [r for r in service.runs().runs if r.trial in wanted]
        bands = band_figure(service.run_group_bands(trials, by, kpi), by=by, kpi=kpi) if by else \
            _empty("Choose a hyperparameter to group the trials by (e.g. everything but the seed).")
        return bands, parallel_figure(runs, kpi)

    @app.callback(Output(kpi_view.ID.TRIALS, "options", allow_duplicate=True),
                  Output(kpi_view.ID.TRIALS, "value", allow_duplicate=True),
                  Output(tabs, "active_tab", allow_duplicate=True), Input(ID.OPEN_GRAPHS, "n_clicks"),
                  State(ID.GRID, "selectedRows"), prevent_initial_call=True)
    def open_graphs(clicks: Any, selected: Any) -> Any:
        trials = [row["trial"] for row in selected or []]
        if not clicks or not trials:
            return no_update, no_update, no_update
        # The options with the value: a dropdown drops a value its options do not hold yet.
        return [{"label": t, "value": t} for t in service.trials()], trials, "graphs"

    @app.callback(Output(trial_select, "value", allow_duplicate=True),
                  Output("compare-trial", "value", allow_duplicate=True),
                  Output(tabs, "active_tab", allow_duplicate=True), Output(ID.MESSAGE, "children", allow_duplicate=True),
                  Input(ID.OPEN_COMPARE, "n_clicks"), State(ID.GRID, "selectedRows"), prevent_initial_call=True)
    def open_compare(clicks: Any, selected: Any) -> Any:
        trials = [row["trial"] for row in selected or []]
        if not clicks:  # the panel was just built (its button appeared): no click yet
            return no_update, no_update, no_update, no_update
        if len(trials) < 2:
            return no_update, no_update, no_update, "Tick two trials to compare them."
        return trials[0], trials[1], "compare", ""


__all__ = ["ID", "band_figure", "column_defs", "grid_row", "panel", "parallel_figure", "plots_shown", "register",
           "table", "validation_panel"]
