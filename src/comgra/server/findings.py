"""The Findings tab: what ``comgra scan`` finds, sorted, filterable, each finding a link to its evidence.

A callback reads the filters, asks the service what its background scanner has found so far
(``findings_progress``: it waits at most ``OPEN_WAIT_SECONDS``, so the tab opens in under a second
on any recording, complete where the findings were saved by an earlier scan), and builds the list with the pure functions below. While trials are still being
scanned, an interval asks again each second and redraws when ``findings_version`` changed. The
same interval-driven callback sends the graph its badges once the shown trial's scan is done. A
finding's link opens the Tensors view on the selection it names (``service.view_link``); its
details plot the statistic that shows the problem across the recorded steps.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import plotly.graph_objects as go
from dash import MATCH, Dash, Input, Output, State, ctx, dcc, html, no_update
from dash.development.base_component import Component

from comgra.analysis.findings import SEVERITIES, Finding
from comgra.errors import ComgraError
from comgra.server.dom import attributes
from comgra.service import RecordingService, finding_link, parse_aggregation

TAB = "findings"
MAX_SHOWN = 200
OPEN_WAIT_SECONDS = 0.6  # the tab waits this long for a scan to finish before it shows what is ready
POLL_MS = 1000  # while a scan runs: how often the tab and the badges look for its results
SEVERITY_CLASSES = {"error": "danger", "warning": "warning", "info": "info"}


class ID:
    SEVERITY = "findings-severity"
    DETECTOR = "findings-detector"
    TRIAL = "findings-trial"
    LIST = "findings-list"
    COUNT = "findings-count"
    POLL = "findings-poll"  # dcc.Interval: enabled while the listed trials are being scanned
    SHOWN_VERSION = "findings-shown-version"  # dcc.Store: the findings_version the list shows
    BADGE_POLL = "findings-badge-poll"  # dcc.Interval: enabled while the shown trial is being scanned
    BADGE_VERSION = "findings-badge-version"  # dcc.Store: [trial, findings_version] of the badges sent
    ROW = "finding-row"  # pattern-matching: {"type": ROW, "index": i}: the Details button of finding i
    ROW_DETAIL = "finding-detail"  # pattern-matching: where finding i's details open, right below it
    ROW_SHOWN = "finding-detail-shown"  # pattern-matching: the detail drawn, for the scroll into view


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
        dcc.Interval(id=ID.POLL, interval=POLL_MS, disabled=True), dcc.Store(id=ID.SHOWN_VERSION),
    ])


def badge_parts() -> list[Component]:
    """The badges' interval and store: in the page from the start (the graph's badges do not wait for the
    Findings tab, whose panel is built when it is first opened)."""
    return [dcc.Interval(id=ID.BADGE_POLL, interval=POLL_MS, disabled=True), dcc.Store(id=ID.BADGE_VERSION)]


def register(app: Dash, service: RecordingService, *, tabs: str, data_version: str, badges: str | None = None,
             current_trial: str | None = None) -> None:
    """The tab's callbacks; with ``badges`` and ``current_trial`` (the graph's badge store and the shown
    trial's store), also the one that sends the graph its badges once the trial's scan is done."""
    @app.callback(Output(ID.LIST, "children"), Output(ID.COUNT, "children"), Output(ID.DETECTOR, "options"),
                  Output(ID.TRIAL, "options"), Output(ID.POLL, "disabled"), Output(ID.SHOWN_VERSION, "data"),
                  Input(tabs, "active_tab"), Input(data_version, "data"), Input(ID.POLL, "n_intervals"),
                  Input(ID.SEVERITY, "value"), Input(ID.DETECTOR, "value"), Input(ID.TRIAL, "value"),
                  State(ID.SHOWN_VERSION, "data"))
    def update_list(active: str, _version: Any, _tick: Any, severities: Any, detectors: Any, trials: Any,
                    shown_version: Any) -> Any:
        if active != TAB:
            return no_update, no_update, no_update, no_update, True, no_update
        polled = ctx.triggered_id == ID.POLL
        try:
            progress = service.findings_progress(wait_seconds=0.0 if polled else OPEN_WAIT_SECONDS)
        except ComgraError as error:
            return html.Div(str(error), className="alert alert-warning"), "", [], [], True, None
        if polled and progress.version == shown_version:
            return no_update, no_update, no_update, no_update, not progress.pending, no_update
        found = progress.findings
        shown = filtered(found, severities, detectors, trials)
        return (findings_list(shown, scanning=progress.pending), count_text(len(shown), len(found), progress.pending),
                _options(f.detector for f in found), _options(f.trial for f in found), not progress.pending,
                progress.version)

    if badges is not None and current_trial is not None:
        _register_badges(app, service, badges=badges, current_trial=current_trial, data_version=data_version)

    @app.callback(Output({"type": ID.ROW_DETAIL, "index": MATCH}, "children"),
                  Input({"type": ID.ROW, "index": MATCH}, "n_clicks"),
                  State(ID.SEVERITY, "value"), State(ID.DETECTOR, "value"), State(ID.TRIAL, "value"),
                  prevent_initial_call=True)
    def show_detail(clicks: Any, severities: Any, detectors: Any, trials: Any) -> Any:
        """The details open right below the finding (a second click closes them): the list can be long, and
        a panel below all of it looked, at 1280x800, as if the click did nothing."""
        trigger = ctx.triggered_id
        if not isinstance(trigger, dict) or not clicks:
            return no_update
        if clicks % 2 == 0:
            return None
        shown = filtered(service.findings_progress().findings, severities, detectors, trials)  # the list shown
        index = trigger.get("index")
        if not isinstance(index, int) or not 0 <= index < len(shown):
            return no_update
        return finding_detail(shown[index], statistic_series(service, shown[index]))

    app.clientside_callback(  # the opened details in view, the finding's own line kept on screen
        """function (children) {
            var id = window.dash_clientside.callback_context.triggered_id;
            if (!children || !id) return window.dash_clientside.no_update;
            var box = document.getElementById(JSON.stringify({index: id.index, type: id.type}));
            var item = box && box.closest(".finding");
            if (item) item.scrollIntoView({block: item.offsetHeight > window.innerHeight ? "start" : "nearest"});
            return id.index;
        }""", Output({"type": ID.ROW_SHOWN, "index": MATCH}, "data"),
        Input({"type": ID.ROW_DETAIL, "index": MATCH}, "children"), prevent_initial_call=True)


def _register_badges(app: Dash, service: RecordingService, *, badges: str, current_trial: str,
                     data_version: str) -> None:
    @app.callback(Output(badges, "data", allow_duplicate=True), Output(ID.BADGE_POLL, "disabled"),
                  Output(ID.BADGE_VERSION, "data"), Input(ID.BADGE_POLL, "n_intervals"),
                  Input(current_trial, "data"), Input(data_version, "data"), State(ID.BADGE_VERSION, "data"),
                  prevent_initial_call=True)
    def refresh_badges(_tick: Any, trial: Any, _version: Any, sent: Any) -> Any:
        if not isinstance(trial, str):
            return no_update, True, no_update
        try:
            version = service.findings_version(trial)  # queues the trial first if its data changed
            pending = bool(service.findings_progress(trial).pending)
            if [trial, version] == sent:
                return no_update, not pending, no_update
            return service.finding_badges(trial), not pending, [trial, version]
        except ComgraError:
            return no_update, True, no_update


# -- pure functions: findings in, components out ---------------------------------------------------------
def filtered(found: list[Finding], severities: Any, detectors: Any, trials: Any) -> list[Finding]:
    """The findings the filters let through, in rank order; an empty detector or trial filter means all."""
    severities = set(severities) if isinstance(severities, list) else set(SEVERITIES)
    detectors = set(detectors) if isinstance(detectors, list) and detectors else None
    trials = set(trials) if isinstance(trials, list) and trials else None
    return [f for f in found if f.severity in severities and (detectors is None or f.detector in detectors)
            and (trials is None or f.trial in trials)][:MAX_SHOWN]


def count_text(shown: int, total: int, scanning: list[str] | None = None) -> str:
    text = f"{shown} of {total} findings" if shown != total else f"{total} findings"
    return text + (f"; scanning {len(scanning)} more trial(s)\u2026" if scanning else "")


def findings_list(found: list[Finding], scanning: list[str] | None = None) -> Component:
    note = [html.P(f"Scanning {', '.join(scanning)}\u2026 its findings appear here when the scan is done.",
                   className="text-muted findings-scanning", role="status")] if scanning else []
    if not found:
        return html.Div(note or [html.P("No findings for these filters.", className="text-muted findings-empty")])
    return html.Div(note + [html.Ol(className="list-unstyled findings-items",
                                    children=[_item(i, f) for i, f in enumerate(found)])])


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
        *_members(finding),
        html.Div(id={"type": ID.ROW_DETAIL, "index": index}, className="findings-detail"),
        dcc.Store(id={"type": ID.ROW_SHOWN, "index": index}),
    ])


def _members(finding: Finding) -> list[Component]:
    """The tensors a summary finding stands for (one cause over many tensors), folded until opened."""
    members = finding.evidence.get("members")
    if not isinstance(members, list) or not members:
        return []
    count = finding.evidence.get("count", len(members))
    return [html.Details(className="finding-members small", children=[
        html.Summary(f"{count} tensors"),
        html.Ul([html.Li(str(m.get("node")) + (f" · step {m['training_step']}" if m.get("training_step") is not None
                                                else ""), className="finding-member") for m in members])])]


def finding_detail(finding: Finding, series: StepSeries | None) -> Component:
    children: list[Component] = [
        html.H2(f"{finding.detector}: {finding.node}", className="h6"),
        html.A("Open this selection in the Tensors view", href=finding_link(finding), className="finding-link"),
        html.Pre(_evidence_text(finding), className="finding-evidence small"),
    ]
    if series is not None and len(series.steps):
        children.append(dcc.Graph(figure=series_figure(finding, series), className="finding-series",
                                  config={"displayModeBar": False}))
    return html.Div(children, **attributes({"data-node": finding.node, "data-trial": finding.trial}))


@dataclasses.dataclass(frozen=True)
class StepSeries:
    """A finding's statistic across the recorded steps; ``over_iterations``: per step, combined over the
    iterations where the node was recorded (the tutorial's output exists only at each step's last iteration,
    which differs between types of step)."""
    steps: list[int]
    values: list[float]
    over_iterations: bool = False


def series_figure(finding: Finding, series: StepSeries) -> go.Figure:
    steps, values = series.steps, series.values
    figure = go.Figure(go.Scatter(x=steps, y=values, mode="lines+markers", name=finding.statistic,
                                  marker={"size": 5}))
    known = set(steps)
    marked = [s for s in finding.steps if s in known]
    if marked:
        lookup = dict(zip(steps, values))
        figure.add_trace(go.Scatter(x=marked, y=[lookup[s] for s in marked], mode="markers",
                                    name=f"flagged ({len(marked)})",
                                    marker={"size": 10, "symbol": "circle-open", "color": "crimson"}))
    over = f", {COMBINED.get(finding.statistic, 'mean')} over each step's iterations" if series.over_iterations else ""
    figure.update_layout(height=260, margin={"l": 50, "r": 10, "t": 30, "b": 40},
                         title=f"{finding.statistic} of {finding.node} ({finding.role}, {finding.kind}) across steps{over}",
                         xaxis_title="training step")
    return figure


# How a step's values at several iterations become one point: the extremes stay extremes.
COMBINED = {"min": "min", "max": "max", "abs_max": "max", "nan_count": "sum", "inf_count": "sum"}


def statistic_series(service: RecordingService, finding: Finding) -> StepSeries | None:
    """The finding's statistic across steps, at the iteration and aggregation of its selection; where that
    iteration misses steps the finding names, per step over all the iterations the node was recorded at."""
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
        read = functools.partial(trial.series, node=finding.node, role=finding.role, kind=finding.kind,
                                 aggregation=aggregation, sample=sample, statistic=finding.statistic)
        table = read(iteration=iteration)
        at_iteration = set(table["training_step"].to_pylist())
        if all(step in at_iteration for step in finding.steps):
            return StepSeries(table["training_step"].to_pylist(), table["value"].to_pylist())
        combine = COMBINED.get(finding.statistic, "mean")
        every = read(iteration=None).group_by("training_step").aggregate([("value", combine)]).sort_by("training_step")
    except ComgraError:
        return None
    return StepSeries(every["training_step"].to_pylist(), every[f"value_{combine}"].to_pylist(), over_iterations=True)


def _evidence_text(finding: Finding) -> str:
    """The numbers behind the message, rounded for reading (4 significant digits; the JSON keeps them all)."""
    return "\n".join(f"{key}: {readable(value)}" for key, value in finding.to_json()["evidence"].items()
                     if key != "members")  # listed in the finding's own fold


def readable(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, list, tuple)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(readable(v) for v in value) + "]"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _options(values: Any) -> list[dict[str, str]]:
    return [{"label": v, "value": v} for v in sorted(set(values))]
