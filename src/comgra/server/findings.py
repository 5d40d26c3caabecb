"""The Findings tab: what ``comgra scan`` finds, sorted, filterable, each finding a link to its evidence.

A callback reads the filters, asks the service (``findings``, which scans each chunk once and
keeps the result until a trial changes), and builds the list with the pure functions below. A
finding's link opens the Tensors view on the selection it names (``service.view_link``); its
details plot the statistic that shows the problem across the recorded steps.
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import ALL, Dash, Input, Output, State, ctx, dcc, html, no_update
from dash.development.base_component import Component

from comgra.analysis.findings import SEVERITIES, Finding
from comgra.errors import ComgraError
from comgra.server.dom import attributes
from comgra.service import RecordingService, finding_link, parse_aggregation

TAB = "findings"
MAX_SHOWN = 200
SEVERITY_CLASSES = {"error": "danger", "warning": "warning", "info": "info"}


class ID:
    SEVERITY = "findings-severity"
    DETECTOR = "findings-detector"
    TRIAL = "findings-trial"
    LIST = "findings-list"
    DETAIL = "findings-detail"
    COUNT = "findings-count"
    ROW = "finding-row"  # pattern-matching: {"type": ROW, "index": i}


def panel() -> html.Div:
    return html.Div(className="findings-panel", children=[
        html.Div(className="d-flex flex-wrap align-items-end gap-4 mb-2 findings-controls", children=[
            html.Div(className="selector", children=[
                html.Label("Severity", className="form-label"),
                dcc.Checklist(id=ID.SEVERITY, value=list(SEVERITIES), inline=True, className="findings-severity",
                              options=[{"label": f" {s} ", "value": s} for s in SEVERITIES])]),
            html.Div(className="selector findings-detectors", children=[
                html.Label("Detector", htmlFor=ID.DETECTOR, className="form-label"),
                dcc.Dropdown(id=ID.DETECTOR, multi=True, placeholder="All detectors")]),
            html.Div(className="selector findings-trials", children=[
                html.Label("Trial", htmlFor=ID.TRIAL, className="form-label"),
                dcc.Dropdown(id=ID.TRIAL, multi=True, placeholder="All trials")]),
            html.Span(id=ID.COUNT, className="findings-count text-muted", role="status"),
        ]),
        dcc.Loading(html.Div(id=ID.LIST, className="findings-list"), delay_show=300),
        html.Div(id=ID.DETAIL, className="findings-detail mt-3"),
    ])


def register(app: Dash, service: RecordingService, *, tabs: str, data_version: str) -> None:
    @app.callback(Output(ID.LIST, "children"), Output(ID.COUNT, "children"), Output(ID.DETECTOR, "options"),
                  Output(ID.TRIAL, "options"), Input(tabs, "active_tab"), Input(data_version, "data"),
                  Input(ID.SEVERITY, "value"), Input(ID.DETECTOR, "value"), Input(ID.TRIAL, "value"))
    def update_list(active: str, _version: Any, severities: Any, detectors: Any, trials: Any) -> Any:
        if active != TAB:
            return no_update, no_update, no_update, no_update
        try:
            found = service.findings()
        except ComgraError as error:
            return html.Div(str(error), className="alert alert-warning"), "", [], []
        shown = filtered(found, severities, detectors, trials)
        return (findings_list(shown), count_text(len(shown), len(found)), _options(f.detector for f in found),
                _options(f.trial for f in found))

    @app.callback(Output(ID.DETAIL, "children"), Input({"type": ID.ROW, "index": ALL}, "n_clicks"),
                  State(ID.SEVERITY, "value"), State(ID.DETECTOR, "value"), State(ID.TRIAL, "value"),
                  prevent_initial_call=True)
    def show_detail(clicks: Any, severities: Any, detectors: Any, trials: Any) -> Any:
        trigger = ctx.triggered_id
        if not isinstance(trigger, dict) or not any(clicks or []):
            return no_update
        shown = filtered(service.findings(), severities, detectors, trials)
        index = trigger.get("index")
        if not isinstance(index, int) or not 0 <= index < len(shown):
            return no_update
        return finding_detail(shown[index], statistic_series(service, shown[index]))


# -- pure functions: findings in, components out ---------------------------------------------------------
def filtered(found: list[Finding], severities: Any, detectors: Any, trials: Any) -> list[Finding]:
    """The findings the filters let through, in rank order; an empty detector or trial filter means all."""
    severities = set(severities) if isinstance(severities, list) else set(SEVERITIES)
    detectors = set(detectors) if isinstance(detectors, list) and detectors else None
    trials = set(trials) if isinstance(trials, list) and trials else None
    return [f for f in found if f.severity in severities and (detectors is None or f.detector in detectors)
            and (trials is None or f.trial in trials)][:MAX_SHOWN]


def count_text(shown: int, total: int) -> str:
    return f"{shown} of {total} findings" if shown != total else f"{total} findings"


def findings_list(found: list[Finding]) -> Component:
    if not found:
        return html.P("No findings for these filters.", className="text-muted findings-empty")
    return html.Ol(className="list-unstyled findings-items", children=[_item(i, f) for i, f in enumerate(found)])


def _item(index: int, finding: Finding) -> html.Li:
    link = finding_link(finding)
    return html.Li(className=f"finding finding-{finding.severity} border-start border-3 "
                             f"border-{SEVERITY_CLASSES.get(finding.severity, 'secondary')} ps-2 mb-2",
                   **attributes({"data-detector": finding.detector, "data-trial": finding.trial,
                                 "data-node": finding.node, "data-severity": finding.severity}), children=[
        html.Div(className="d-flex flex-wrap gap-2 align-items-baseline", children=[
            html.Span(finding.severity, className=f"badge text-bg-{SEVERITY_CLASSES.get(finding.severity, 'secondary')}"),
            html.Span(finding.detector, className="finding-detector fw-semibold"),
            html.Span(f"{finding.trial} · {finding.node}" + (f" · step {finding.training_step}"
                                                              if finding.training_step is not None else ""),
                      className="finding-where text-muted"),
            html.A("Open in Tensors", href=link, className="finding-link", title=link),
            html.Button("Details", id={"type": ID.ROW, "index": index}, n_clicks=0,
                        className="btn btn-link btn-sm p-0 finding-details"),
        ]),
        html.Div(finding.message, className="finding-message"),
    ])


def finding_detail(finding: Finding, series: tuple[list[int], list[float]] | None) -> Component:
    children: list[Component] = [
        html.H2(f"{finding.detector}: {finding.node}", className="h6"),
        html.P(finding.message),
        html.A("Open this selection in the Tensors view", href=finding_link(finding), className="finding-link"),
        html.Pre(_evidence_text(finding), className="finding-evidence small"),
    ]
    if series is not None and len(series[0]):
        children.append(dcc.Graph(figure=series_figure(finding, *series), className="finding-series",
                                  config={"displayModeBar": False}))
    return html.Div(children, **attributes({"data-node": finding.node, "data-trial": finding.trial}))


def series_figure(finding: Finding, steps: list[int], values: list[float]) -> go.Figure:
    figure = go.Figure(go.Scatter(x=steps, y=values, mode="lines+markers", name=finding.statistic))
    marked = [s for s in finding.steps if s in set(steps)]
    if marked:
        lookup = dict(zip(steps, values))
        figure.add_trace(go.Scatter(x=marked, y=[lookup[s] for s in marked], mode="markers", name="flagged",
                                    marker={"size": 10, "symbol": "circle-open", "color": "crimson"}))
    figure.update_layout(height=260, margin={"l": 50, "r": 10, "t": 30, "b": 40},
                         title=f"{finding.statistic} of {finding.node} ({finding.role}, {finding.kind}) across steps",
                         xaxis_title="training step")
    return figure


def statistic_series(service: RecordingService, finding: Finding) -> tuple[list[int], list[float]] | None:
    """The finding's statistic across steps, at the iteration and aggregation of its selection."""
    if finding.role is None or finding.kind is None:
        return None
    aggregation, sample = parse_aggregation(finding.aggregation or "mean")
    trial = service.trial(finding.trial)
    iteration = finding.iteration if finding.iteration is not None else 0
    try:
        rows = trial.selection(training_step=finding.training_step, node=finding.node, role=finding.role,
                               kind=finding.kind, columns=["iteration"]) if finding.training_step is not None else None
        if rows is not None and rows.num_rows and iteration not in rows["iteration"].to_pylist():
            iteration = rows["iteration"].to_pylist()[0]  # parameters live under iteration -1
        table = trial.series(node=finding.node, role=finding.role, kind=finding.kind, iteration=iteration,
                             aggregation=aggregation, sample=sample, statistic=finding.statistic)
    except ComgraError:
        return None
    return table["training_step"].to_pylist(), table["value"].to_pylist()


def _evidence_text(finding: Finding) -> str:
    lines = [f"{key}: {value}" for key, value in finding.to_json()["evidence"].items()]
    return "\n".join(lines)


def _options(values: Any) -> list[dict[str, str]]:
    return [{"label": v, "value": v} for v in sorted(set(values))]
