"""The Health tab: the training's health at a glance (``service.health``). A heatmap of each layer's gradient
norm over the recorded steps (log scale; a click offers the link that opens that gradient in the Tensors
tab), the sentinels' events (NaN, inf, empty batches, on recorded steps or not), the dead units, and the
findings by node, each linked to the selection that shows it."""
from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html, no_update

from comgra.server.guards import guarded
from comgra.service import RecordingService
from comgra.service.health import TrainingHealth

WAIT_FOR_FINDINGS_S = 0.3


class ID:
    CONTENT = "health-content"
    HEATMAP = "health-gradients"
    CELL = "health-cell"  # the link of the heatmap cell clicked last
    LINKS = "health-links"  # dcc.Store: layers, steps and [layer][step] -> link, for the clicked cell
    WAIT = "health-wait"  # dcc.Interval: on while the trial's findings are being scanned, to show them when done


def panel() -> html.Div:
    return html.Div(className="health-panel", children=[
        dcc.Store(id=ID.LINKS, data={}),
        dcc.Interval(id=ID.WAIT, interval=1000, disabled=True),
        html.H5("Gradient norm per layer"),
        dcc.Graph(id=ID.HEATMAP, figure=go.Figure(), config={"displaylogo": False}, style={"display": "none"}),
        html.Div(id=ID.CELL, className="health-cell mt-1"),
        html.Div(id=ID.CONTENT),
    ])


def register(app: Dash, service: RecordingService, *, tabs: str, current_trial: str, data_version: str) -> None:
    @app.callback(Output(ID.CONTENT, "children"), Output(ID.HEATMAP, "figure"), Output(ID.HEATMAP, "style"),
                  Output(ID.LINKS, "data"), Output(ID.WAIT, "disabled"), Input(tabs, "active_tab"),
                  Input(current_trial, "data"), Input(data_version, "data"), Input(ID.WAIT, "n_intervals"))
    def update(active: str, trial: Any, _version: Any, _waited: Any) -> Any:
        if active != "health":
            return no_update, no_update, no_update, no_update, True
        known = service.trials()
        chosen = trial if trial in known else (known[0] if known else None)
        if chosen is None:
            return html.Div("This recording has no trials yet.", className="alert alert-warning"), no_update, \
                HIDDEN, {}, True
        return guarded(lambda: answer(service.training_health(chosen, WAIT_FOR_FINDINGS_S)),
                       lambda message: (html.Div(message, className="alert alert-warning"), no_update, HIDDEN, {}, True))

    @app.callback(Output(ID.CELL, "children"), Input(ID.HEATMAP, "clickData"), State(ID.LINKS, "data"),
                  prevent_initial_call=True)
    def open_cell(click: Any, links: Any) -> Any:
        return cell_link(click, links)


HIDDEN = {"display": "none"}


def answer(health: TrainingHealth) -> tuple[list[Any], Any, dict[str, str], dict[str, Any], bool]:
    """The tab's content, the heatmap and its style, the cells' links (by layer and step: a click names its cell
    by its x and y), and whether to stop asking again (the findings are complete), for one trial (pure)."""
    done = not health.pending
    if not health.layers:
        return components(health), go.Figure(), HIDDEN, {}, done
    links = {"layers": health.layers, "steps": [str(s) for s in health.steps], "links": health.cell_links}
    return components(health), gradient_heatmap(health), {}, links, done


def components(health: TrainingHealth) -> list[Any]:
    """Everything below the heatmap."""
    parts: list[Any] = []
    if health.layers:
        parts.append(html.P([html.Span(className="missing-swatch", style={"background": MISSING_COLOUR}),
                             MISSING_LEGEND], className="text-muted small health-missing-legend"))
        parts.append(html.P("Click a cell for the link to that layer's gradient at that step.", className="text-muted"))
    else:
        parts.append(html.P("No gradient norms in this trial (comgra records them on the steps it records with "
                            "gradients).", className="text-muted"))
    parts += [html.H5("Sentinel events", className="mt-3"), _events(health),
              html.H5("Dead units", className="mt-3"), _dead(health),
              html.H5("Findings by node", className="mt-3"), _findings(health)]
    return parts


MISSING_COLOUR = "#BDBDBD"  # the heatmap's cells without a colour: the plot's background, named in the legend
MISSING_LEGEND = ("Grey: no colour for that layer at that step: its gradient was not recorded (hover: \"not "
                  "recorded\"), or its norm is 0 or not finite (hover: 0, inf or nan), which a log scale cannot show.")
CLIP = 160  # characters of a finding's message in the table; the whole message on hover


def gradient_heatmap(health: TrainingHealth) -> go.Figure:
    z = [[math.log10(v) if v is not None and v > 0 and math.isfinite(v) else None for v in row] for row in health.grad_norm]
    text = [[f"{v:.3g}" if v is not None else "not recorded" for v in row] for row in health.grad_norm]
    figure = go.Figure(go.Heatmap(z=z, x=[str(s) for s in health.steps], y=health.layers, text=text,
                                  colorscale="Viridis", colorbar={"title": "log10 norm"}, hoverongaps=True,
                                  hovertemplate="%{y}<br>step %{x}<br>gradient norm %{text}<extra></extra>"))
    figure.update_layout(height=max(260, 22 * len(health.layers) + 120), margin={"l": 10, "r": 10, "t": 10, "b": 40},
                         xaxis={"title": "recorded training step", "type": "category"},
                         yaxis={"autorange": "reversed"}, plot_bgcolor=MISSING_COLOUR)
    return figure


def clipped(text: str, limit: int = CLIP) -> Any:
    """``text`` whole, or cut at a word before ``limit`` characters with an ellipsis, the whole text on hover."""
    if len(text) <= limit:
        return html.Span(text, title=text)
    cut = text[:limit - 1]
    cut = cut[:cut.rfind(" ")] if " " in cut[limit // 2:] else cut
    return html.Span(cut.rstrip(" ,;:.") + "…", title=text, className="clipped")


def cell_link(click: Any, links: Any) -> Any:
    """The link of a clicked heatmap cell, found by the point's layer (y) and step (x) in ``links``."""
    try:
        point = click["points"][0]
        row, column = links["layers"].index(point["y"]), links["steps"].index(str(point["x"]))
        link = links["links"][row][column]
    except (KeyError, IndexError, TypeError, ValueError):
        return no_update
    if not link:
        return html.Span("No gradient at that step.", className="text-muted")
    return html.A(f"Open {point['y']}'s gradient at step {point['x']} in the Tensors tab", href=link)


def _events(health: TrainingHealth) -> Any:
    if not health.events:
        return html.P("None: every sentinel was finite on every step.", className="text-muted")
    rows = [html.Tr([html.Td(e["training_step"]), html.Td(e["name"]), html.Td(e["event"]),
                     html.Td("recorded" if e["recorded"] else "not recorded"),
                     html.Td(html.A(f"step {e['shown_step']}", href=e["link"]) if e["link"] else "")])
            for e in health.events]
    more = [] if health.event_count <= len(health.events) else [
        html.P(f"... and {health.event_count - len(health.events)} more.", className="text-muted")]
    header = html.Thead(html.Tr([html.Th(t) for t in ("step", "tensor", "event", "", "nearest recorded")]))
    return html.Div([html.Table([header, html.Tbody(rows)], className="table table-sm health-events"), *more])


def _dead(health: TrainingHealth) -> Any:
    if not health.dead_units:
        return html.P("None found" + (" yet (scanning)." if health.pending else "."), className="text-muted")
    return html.Ul([html.Li([html.A(d["node"], href=d["link"]), ": ", clipped(d["message"], 2 * CLIP)])
                    for d in health.dead_units])


def _findings(health: TrainingHealth) -> Any:
    if not health.findings_by_node:
        return html.P("None" + (" yet (scanning)." if health.pending else "."), className="text-muted")
    rows = [html.Tr([html.Td(html.A(f["node"], href=f["link"])), html.Td(f["error"]), html.Td(f["warning"]),
                     html.Td(f["info"]), html.Td(clipped(f["top"]))]) for f in health.findings_by_node]
    header = html.Thead(html.Tr([html.Th(t) for t in ("node", "errors", "warnings", "info", "most important")]))
    return html.Table([header, html.Tbody(rows)], className="table table-sm health-findings")
