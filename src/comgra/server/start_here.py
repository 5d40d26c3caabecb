"""The "Start here" path above the Tensors view: the most important finding, the node that shows it and the
plot that proves it, one click each.

A newcomer opened the demo at step 0, iteration 0, where neither the output nor the loss is in the graph, and
had to find the Findings tab alone. This strip shows the most important warning or error the background scan found
and can be closed; the browser remembers that (local storage).

Its line is there from the first drawing of the page, so that nothing below it moves when the scan ends: while the
scan runs it says so, and a scan that found no warning or error says that. (The strip used to appear alone, about
2 s after the page, and pushed the graph 39 px down under the user's pointer.) A page of a browser that closed it
hides the line before it is drawn (``assets/comgra.js``).

- *The finding* opens the Findings tab, where it is listed first.
- *The node that shows it* opens the Tensors view on the finding's selection (``finding_link``).
- *The plot that proves it* opens the same selection with the finding's statistic across steps, every trial
  a curve (the tutorial: the bugged trial's ``min`` of ``subnet_out__out`` stays near 0, the fixed one's
  goes negative), and scrolls to that plot (``show=series``).
"""
from __future__ import annotations

from typing import Any

from dash import ALL, Dash, Input, Output, State, dcc, html, no_update
from dash.development.base_component import Component

from comgra.analysis.findings import Finding
from comgra.errors import ComgraError
from comgra.server.dom import attributes
from comgra.service import RecordingService, finding_link, view_link
from comgra.service.findings import FindingsProgress

__all__ = ["line", "panel", "register", "start_here", "SHOW_SERIES"]

SHOW_SERIES = "show=series"  # in a view link: scroll to the series plot once it is drawn
POLL_MS = 1000
GUIDED = ("error", "warning")  # the severities worth a newcomer's first click


class ID:
    BOX = "start-here"  # the line: a status (``start-here-status``) or the strip (``start-here-box``)
    POLL = "start-here-poll"
    DISMISSED = "start-here-dismissed"  # dcc.Store in local storage: closed by the user
    CLOSE = "start-here-close"
    SCROLLED = "start-here-scrolled"


def panel() -> list[Component]:
    return [html.Div(id=ID.BOX, className="start-here", children=status(SCANNING)),
            dcc.Interval(id=ID.POLL, interval=POLL_MS),
            dcc.Store(id=ID.DISMISSED, storage_type="local"), dcc.Store(id=ID.SCROLLED)]


def guide_finding(found: list[Finding]) -> Finding | None:
    """The finding the path starts from: the first (most important) error or warning, if any."""
    return next((f for f in found if f.severity in GUIDED), None)


SCANNING = "the background scan is looking for problems\u2026"
NOTHING_FOUND = "the background scan found no warning or error (the Findings tab lists what it checked)"
NO_SCAN = "no findings to show: the background scan could not run"
SCAN_OFF = "the background scan is off here (--no-findings-scan): only findings saved by `comgra scan` are shown"


def status(text: str) -> Component:
    """The line while there is no finding to start from: the same height as the strip (nothing moves when the strip
    replaces it), and it closes the same way."""
    return html.Div(className="start-here-status", role="status", children=[
        html.Strong("Start here", className="start-here-title"), html.Span(text, className="start-here-text"),
        _close_button()])


def _close_button() -> Component:
    # A pattern-matching id: the button exists only with the line, and an ALL input with no match is no error (a plain
    # id missing from the first layout was one, in the console on every load).
    return html.Button("\u00d7", id={"type": ID.CLOSE, "index": 0}, n_clicks=0,
                       className="btn-close-text start-here-close",
                       title="Close (comgra remembers it in this browser)", **attributes({"aria-label": "Close"}))


def start_here(finding: Finding | None) -> Component | None:
    """The strip for ``finding`` (None: nothing to show). A pure function: findings in, components out."""
    if finding is None:
        return None
    link = finding_link(finding)
    trials = "per trial"
    steps = [
        ("1", "The finding", view_link(finding.trial, tab="findings"), f"{finding.detector} ({finding.severity})"),
        ("2", "The node that shows it", link,
         finding.node + ("" if finding.training_step is None else f", step {finding.training_step}")),
        ("3", "The plot that proves it", f"{link}&{SHOW_SERIES}", f"{finding.statistic} per step, {trials}"),
    ]
    return html.Div(className="start-here-box", role="region", **attributes({"aria-label": "Start here"}), children=[
        html.Strong("Start here", className="start-here-title"),
        html.Ol(className="start-here-steps", children=[
            html.Li(className="start-here-step", title=finding.message if number == "1" else text,
                    **attributes({"data-step": number}), children=[
                html.A(label, href=href, className="start-here-link", title=href),
                html.Span(" " + text, className="start-here-text")])
            for number, label, href, text in steps]),
        _close_button(),
    ])


def line(progress: FindingsProgress) -> Component:
    """What the line shows: the strip of the first warning or error found, else where the scan stands."""
    strip = start_here(guide_finding(progress.findings))
    if strip is not None:
        return strip
    return status(SCANNING if progress.pending else NOTHING_FOUND if progress.background else SCAN_OFF)


def register(app: Dash, service: RecordingService, *, series: str, url: str) -> None:
    """The strip's callbacks; ``series`` is the id of the Tensors view's series plot, ``url`` the dcc.Location (its
    links open their view without a reload: assets/comgra.js)."""
    @app.callback(Output(ID.BOX, "children"), Output(ID.POLL, "disabled"), Input(ID.POLL, "n_intervals"),
                  Input(ID.DISMISSED, "data"))
    def show(_tick: Any, dismissed: Any) -> Any:
        if dismissed:
            return None, True
        try:
            progress = service.findings_progress()
        except ComgraError:
            return status(NO_SCAN), True
        return line(progress), not progress.pending

    @app.callback(Output(ID.DISMISSED, "data"), Input({"type": ID.CLOSE, "index": ALL}, "n_clicks"),
                  prevent_initial_call=True)
    def close(clicks: Any) -> Any:
        return True if isinstance(clicks, list) and any(clicks) else no_update

    app.clientside_callback(  # "the plot that proves it": in view once drawn, once per page load
        """function (children, search) {
            // Once per address asking for it: a Start here link changes the address without a reload.
            if (!children || window.comgraSeriesShownFor === search || (search || "").indexOf("%s") < 0)
                return window.dash_clientside.no_update;
            window.comgraSeriesShownFor = search;
            var tries = 0;
            (function show() {  // Plotly draws after Dash rendered the children: wait for the plot (at most 10 s)
                var plot = document.getElementById("%s");
                var drawn = plot && plot.querySelector(".js-plotly-plot .main-svg");
                if (drawn) plot.scrollIntoView({block: "center"});
                else if (tries++ < 100) window.setTimeout(show, 100);
            })();
            return true;
        }""" % (SHOW_SERIES, series), Output(ID.SCROLLED, "data"), Input(series, "children"), State(url, "search"))
