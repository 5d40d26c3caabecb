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
            html.Div(className="selector kpi-smoothing", style={"minWidth": "260px"}, children=[
                html.Label("Smoothing", htmlFor=ID.SMOOTHING, className="form-label"),
                dcc.Slider(id=ID.SMOOTHING, min=0, max=0.99, step=0.01, value=0,
                           marks={0: "0", 0.5: "0.5", 0.99: "0.99"}, tooltip={"placement": "bottom"})]),
        ]),
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

    @app.callback(Output(ID.FIGURES, "children"), Input(tabs, "active_tab"), Input(current_trial, "data"),
                  Input(data_version, "data"), Input(ID.TRIALS, "value"), Input(ID.OPTIONS, "value"),
                  Input(ID.SMOOTHING, "value"), Input(ID.FILTER, "value"))
    def update_figures(active: str, trial: Any, _version: Any, chosen: Any, options: Any, smoothing: Any,
                       name_filter: Any = "") -> Any:
        if active != "graphs":
            return no_update
        try:
            trials = chosen_trials(service, chosen, trial)
            if not trials:
                return html.Div("This recording has no trials yet.", className="alert alert-warning")
            return kpi_graphs(service, trials, kpi_options(options, smoothing, name_filter))
        except ComgraError as error:
            return html.Div(str(error), className="alert alert-warning")


def kpi_csv(service: RecordingService, trials: list[str], name_filter: str = "") -> str:
    """The KPI points of ``trials`` as CSV (trial, group, name, type of step, step, value; ranks as in the
    figures), only the curves whose name holds ``name_filter``."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["trial", "kpi_group", "kpi_name", "type_of_execution", "training_step", "value"])
    wanted = name_filter.strip().lower()
    for trial in trials:
        for row in service.kpis(trial).to_pylist():
            name = row["kpi_name"] if row.get("rank") in (None, 0) or "rank" not in row else \
                f"{row['kpi_name']} · rank {row['rank']}"
            if wanted and wanted not in f"{row['kpi_group']} · {name} · {row['type_of_execution']}".lower():
                continue
            writer.writerow([trial, row["kpi_group"], name, row["type_of_execution"], row["timepoint"],
                             repr(row["value"])])
    return out.getvalue()


def chosen_trials(service: RecordingService, chosen: Any, current: Any) -> list[str]:
    """The trials to draw: those chosen that exist; else the trial of the Tensors tab; else the first."""
    known = service.trials()
    picked = [t for t in chosen if t in known] if isinstance(chosen, list) else []
    if picked:
        return picked
    return [current] if current in known else known[:1]


def kpi_options(options: Any, smoothing: Any, name_filter: Any = "") -> figures.KpiOptions:
    values = options if isinstance(options, list) else []
    weight = float(smoothing) if isinstance(smoothing, (int, float)) and not isinstance(smoothing, bool) else 0.0
    return figures.KpiOptions(log_y=LOG_Y in values, robust_range=ROBUST in values,
                              smoothing=min(0.99, max(0.0, weight)),
                              name_filter=name_filter[:200] if isinstance(name_filter, str) else "")


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
