"""The Graphs tab: the KPIs of one trial or of several overlaid, with log scale, smoothing and a y-range that
one spike does not flatten (the points beyond it stay visible at its edge)."""
from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from comgra.errors import ComgraError
from comgra.server import figures
from comgra.server.dom import attributes
from comgra.service import RecordingService

LOG_Y = "log"
ROBUST = "robust"


class ID:
    TRIALS = "kpi-trials"
    OPTIONS = "kpi-options"
    SMOOTHING = "kpi-smoothing"
    FILTER = "kpi-filter"  # text: only the curves whose name holds it
    CSV = "kpi-csv"
    DOWNLOAD = "kpi-download"
    X_AXIS = "kpi-x-axis"  # step, wall time or relative time (TensorBoard's three)
    X_NOTE = "kpi-x-note"  # why the two by time are off
    FIGURES = "kpi-graphs"  # the figures, one per KPI group (the id the tests and links knew before)


def panel() -> html.Div:
    return html.Div(className="kpi-panel", children=[
        html.Div(className="d-flex flex-wrap align-items-end gap-4 mb-2 kpi-controls", children=[
            html.Div(className="selector kpi-trials", children=[
                html.Label("Trials (overlaid)", htmlFor=ID.TRIALS, className="form-label"),
                dcc.Dropdown(id=ID.TRIALS, multi=True, placeholder="The trial shown in the Tensors tab")]),
            dcc.Checklist(id=ID.OPTIONS, value=[ROBUST], inline=True, className="kpi-options",
                          options=[{"label": " log scale", "value": LOG_Y},
                                   {"label": " y-range of the bulk (spikes marked at the edge)", "value": ROBUST}],
                          inputStyle={"marginLeft": "0.8em"}),
            html.Div(className="selector kpi-filter", children=[
                html.Label("Figures or curves named", htmlFor=ID.FILTER, className="form-label"),
                dcc.Input(id=ID.FILTER, type="search", placeholder="e.g. loss", debounce=0.4, value="",
                          className="form-control form-control-sm")]),
            html.Div(className="selector kpi-x", children=[
                html.Label("x-axis", htmlFor=ID.X_AXIS, className="form-label d-block"),
                dcc.RadioItems(id=ID.X_AXIS, value="step", inline=True, className="kpi-x-axis",
                               options=x_axis_options(True), inputStyle={"marginLeft": "0.8em"})]),
            html.Div(className="selector kpi-smoothing", style={"minWidth": "260px"}, children=[
                html.Label("Smoothing", htmlFor=ID.SMOOTHING, className="form-label"),
                dcc.Slider(id=ID.SMOOTHING, min=0, max=0.99, step=0.01, value=0,
                           marks={0: "0", 0.5: "0.5", 0.99: "0.99"}, tooltip={"placement": "bottom"})]),
        ]),
        html.Small(id=ID.X_NOTE, className="text-muted d-block mb-1"),
        html.Div(className="mb-2", children=[
            html.Button("Download CSV", id=ID.CSV, n_clicks=0, className="btn btn-outline-secondary btn-sm",
                        title="The points of the curves shown (the chosen trials, the name filter), unsmoothed"),
            dcc.Download(id=ID.DOWNLOAD)]),
        html.Div(id=ID.FIGURES),
    ])


def register(app: Dash, service: RecordingService, *, tabs: str, current_trial: str, data_version: str) -> None:
    @app.callback(Output(ID.DOWNLOAD, "data"), Input(ID.CSV, "n_clicks"), State(current_trial, "data"),
                  State(ID.TRIALS, "value"), State(ID.FILTER, "value"), prevent_initial_call=True)
    def download(clicks: Any, trial: Any, chosen: Any, name_filter: Any) -> Any:
        if not clicks:
            return no_update
        trials = chosen_trials(service, chosen, trial)
        return dcc.send_string(kpi_csv(service, trials, name_filter if isinstance(name_filter, str) else ""),
                               "comgra-kpis.csv")

    @app.callback(Output(ID.TRIALS, "options"), Input(tabs, "active_tab"), Input(data_version, "data"))
    def update_trials(active: str, _version: Any) -> Any:
        if active != "graphs":
            return no_update
        return [{"label": t, "value": t} for t in service.trials()]

    @app.callback(Output(ID.FIGURES, "children"), Output(ID.X_AXIS, "options"), Output(ID.X_NOTE, "children"),
                  Input(tabs, "active_tab"), Input(current_trial, "data"),
                  Input(data_version, "data"), Input(ID.TRIALS, "value"), Input(ID.OPTIONS, "value"),
                  Input(ID.SMOOTHING, "value"), Input(ID.FILTER, "value"), Input(ID.X_AXIS, "value"))
    def update_figures(active: str, trial: Any, _version: Any, chosen: Any, options: Any, smoothing: Any,
                       name_filter: Any = "", x_axis: Any = "step") -> Any:
        if active != "graphs":
            return no_update, no_update, no_update
        try:
            trials = chosen_trials(service, chosen, trial)
            if not trials:
                return html.Div("This recording has no trials yet.", className="alert alert-warning"), \
                    x_axis_options(True), ""
            untimed = untimed_trials(service, trials)
            note = untimed_note(untimed)
            chosen_axis = x_axis if x_axis in figures.X_AXES and not untimed else "step"
            return kpi_graphs(service, trials, kpi_options(options, smoothing, name_filter, chosen_axis)), \
                x_axis_options(not untimed), note
        except ComgraError as error:
            return html.Div(str(error), className="alert alert-warning"), no_update, no_update


def x_axis_options(timed: bool) -> list[dict[str, Any]]:
    """The x-axis switch: the two by time are off where a trial's KPI points have no recorded time."""
    return [{"label": " step", "value": "step"},
            {"label": " wall time", "value": "wall", "disabled": not timed},
            {"label": " relative", "value": "relative", "disabled": not timed}]


def untimed_trials(service: RecordingService, trials: list[str]) -> list[str]:
    """The trials with KPI points of which none has its time (recorded before the KPI table had wall_time)."""
    untimed = []
    for trial in trials:
        table = service.kpis(trial)
        if table.num_rows and ("wall_time" not in table.column_names or table["wall_time"].null_count == table.num_rows):
            untimed.append(trial)
    return untimed


def untimed_note(untimed: list[str]) -> str:
    if not untimed:
        return ""
    names = ", ".join(repr(t) for t in untimed[:3]) + (f" and {len(untimed) - 3} more" if len(untimed) > 3 else "")
    return (f"Wall time and relative time are off: the KPI points of {names} have no recorded time (recorded "
            "with a comgra before the KPI table kept the time of each point). Record again to plot them by time.")


def kpi_csv(service: RecordingService, trials: list[str], name_filter: str = "") -> str:
    """The KPI points of ``trials`` as CSV (trial, group, name, type of step, step, value, and wall_time in
    seconds since the epoch where the KPI table has it, as TensorBoard's CSV; ranks as in the figures), only the
    curves whose name holds ``name_filter``."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    tables = {trial: service.kpis(trial) for trial in trials}
    timed = any("wall_time" in t.column_names and t["wall_time"].null_count < t.num_rows for t in tables.values())
    writer.writerow(["trial", "kpi_group", "kpi_name", "type_of_execution", "training_step", "value",
                     *(["wall_time"] if timed else [])])
    wanted = name_filter.strip().lower()
    for trial, table in tables.items():
        for row in table.to_pylist():
            name = row["kpi_name"] if row.get("rank") in (None, 0) or "rank" not in row else \
                f"{row['kpi_name']} · rank {row['rank']}"
            if wanted and wanted not in f"{row['kpi_group']} · {name} · {row['type_of_execution']}".lower():
                continue
            time = row.get("wall_time")
            writer.writerow([trial, row["kpi_group"], name, row["type_of_execution"], row["timepoint"],
                             repr(row["value"]), *([] if not timed else ["" if time is None else repr(time)])])
    return out.getvalue()


def chosen_trials(service: RecordingService, chosen: Any, current: Any) -> list[str]:
    """The trials to draw: those chosen that exist; else the trial of the Tensors tab; else the first."""
    known = service.trials()
    picked = [t for t in chosen if t in known] if isinstance(chosen, list) else []
    if picked:
        return picked
    return [current] if current in known else known[:1]


def kpi_options(options: Any, smoothing: Any, name_filter: Any = "", x_axis: Any = "step") -> figures.KpiOptions:
    values = options if isinstance(options, list) else []
    weight = float(smoothing) if isinstance(smoothing, (int, float)) and not isinstance(smoothing, bool) else 0.0
    return figures.KpiOptions(log_y=LOG_Y in values, robust_range=ROBUST in values,
                              smoothing=min(0.99, max(0.0, weight)),
                              name_filter=name_filter[:200] if isinstance(name_filter, str) else "",
                              x_axis=x_axis if x_axis in figures.X_AXES else "step")


def kpi_graphs(service: RecordingService, trials: list[str], options: figures.KpiOptions) -> Any:
    entries = figures.kpi_overlay_figures({t: service.kpis(t) for t in trials}, options, all_trials=service.trials())
    if not entries:
        if options.name_filter.strip():
            return html.P(f"No figure's title or curve's name holds {options.name_filter.strip()!r}.",
                          className="text-muted")
        return html.P("No KPIs in " + ("these trials" if len(trials) > 1 else "this trial")
                      + " (record_kpi_in_graph was not called).", className="text-muted")
    return [html.Div(dcc.Graph(figure=figure, config={"displaylogo": False}), className="kpi-graph",
                     **attributes({"data-kpi-group": group, "data-curves": str(_curves(figure))}))
            for group, figure in entries]


def _curves(figure: Any) -> int:
    """The curves a user sees in the legend (raw and outlier traces are drawn with their curve)."""
    return sum(1 for trace in figure.data if trace.showlegend is not False)
