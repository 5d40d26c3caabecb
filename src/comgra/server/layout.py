"""The page skeleton: tabs, selectors, the graph area and the output panels.

Everything dynamic is filled in by callbacks; this module only decides where
things are. The ids it gives the components are in ``ids.py``.

Only the Tensors tab is in the first page: every other tab's panel is an empty box until the tab is first
opened, when ``panel_contents`` fills it (issue 34: the first page at most 1.5 s). A hidden tab's components
then cost the first page nothing, and their callbacks, which Dash fires when their components appear, fire
when the tab opens, not at load. ``full_page`` is the page with every panel built: what Dash checks the
callbacks against.
"""
from __future__ import annotations

import dash_bootstrap_components as dbc
from dash import dcc, html
from dash.development.base_component import Component

from comgra.server import breakpoints as breakpoints_panel
from comgra.server import compare, health_view, images_view, kpi_view, profile_panel, samples
from comgra.server import findings as findings_panel
from comgra.server import runs_view, start_here
from comgra.server.dom import attributes
from comgra.server.graph_view import legend
from comgra.server.ids import ID, TABS
from comgra.service import PLOT_STATISTICS, RecordingService

TAB_LABELS = {"tensors": "Tensors", "runs": "Runs", "findings": "Findings", "health": "Health", "samples": "Samples", "images": "Images", "compare": "Compare", "network": "Network", "notes": "Notes", "graphs": "Graphs",
              "profile": "Profile", "resources": "Resources", "breakpoints": "Breakpoints", "visualization": "Visualization"}
NAVIGATION = {"left": "←", "up": "↑", "down": "↓", "right": "→"}
ZOOM = {"out": ("−", "Zoom out"), "fit": ("Fit", "Fit the graph into view"), "in": ("+", "Zoom in")}
NAVIGATION_HELP = {"left": "Go to a node this one depends on", "right": "Go to a node that depends on this one",
                   "up": "Go to the node above", "down": "Go to the node below"}


# Built together on the first opening of the first: the Runs tab's buttons open Graphs and Compare on its trials.
OPENED_TOGETHER = {"runs": ("runs", "graphs", "compare")}


def tabs_shown(with_visualization: bool) -> list[str]:
    return [t for t in TABS if with_visualization or t != "visualization"]


def lazy_tabs(with_visualization: bool) -> list[str]:
    """The tabs whose panels are built when first opened: all but Tensors, the first page."""
    return [t for t in tabs_shown(with_visualization) if t != "tensors"]


def page(*, title: str, data_version: str, poll_ms: int, with_visualization: bool) -> html.Div:
    """The first page: the Tensors tab, and an empty panel for each other tab."""
    return _page(title, data_version, poll_ms, with_visualization, built=False)


def full_page(*, with_visualization: bool) -> html.Div:
    """The page with every tab's panel built (Dash's ``validation_layout``)."""
    return _page("", "", 1000, with_visualization, built=True)


def panel_contents(active: str, built: list[str], with_visualization: bool, *,
                   service: RecordingService | None = None) -> dict[str, Component]:
    """The panels to build when ``active`` is opened and ``built`` are already: tab -> its content. With ``service``,
    the Runs tab's table comes filled (its rows in the same answer)."""
    wanted = OPENED_TOGETHER.get(active, (active,))
    return {t: runs_view.panel(service) if t == "runs" else _PANELS[t]() for t in wanted
            if t in lazy_tabs(with_visualization) and t not in built}


_PANELS = {
    "runs": runs_view.panel, "findings": findings_panel.panel, "health": health_view.panel, "samples": samples.panel,
    "images": images_view.panel, "compare": compare.panel, "network": lambda: html.Div(id=ID.NETWORK),
    "notes": lambda: html.Div(id=ID.NOTES), "graphs": kpi_view.panel,  # kpi_view.panel holds ID.KPIS
    **profile_panel.PANELS, "breakpoints": breakpoints_panel.panel,
    "visualization": lambda: html.Div(id=ID.VISUALIZATION)}
_VALIDATION = {"runs": runs_view.validation_panel}  # a panel whose parts are made later, with them made


def _page(title: str, data_version: str, poll_ms: int, with_visualization: bool, *, built: bool) -> html.Div:
    tabs = tabs_shown(with_visualization)
    return html.Div(className="comgra container-fluid", children=[
        dcc.Store(id=ID.SELECTION, storage_type="memory", data={"wanted": {}, "shown": None}),
        dcc.Store(id=ID.SHOWN, storage_type="memory"),
        dcc.Store(id=ID.CURRENT_TRIAL, storage_type="memory"),
        dcc.Store(id=ID.DATA_VERSION, data=data_version),
        dcc.Store(id=ID.NODE_CLICK),
        dcc.Location(id=ID.URL, refresh=False),
        dcc.Store(id=ID.LINK), dcc.Store(id=ID.URL_WRITTEN),
        dcc.Store(id=ID.GRAPH_KEY), dcc.Store(id=ID.GRAPHS, data={}), dcc.Store(id=ID.GRAPHS_KNOWN, data=[]),
        dcc.Store(id=ID.GRAPH_RENDERED), dcc.Store(id=ID.BADGES, data={}), *findings_panel.badge_parts(),
        dcc.Store(id=ID.STEP_KEY), dcc.Store(id=ID.SEARCH_ELSEWHERE, data=[]), dcc.Store(id=ID.NODE_SUMMARIES, data={}), dcc.Store(id=ID.NOTICES, data={}),
        dcc.Store(id=ID.VALUES_DATA), dcc.Store(id=ID.VALUES_RENDERED), dcc.Store(id=ID.SUMMARIES_SET),
        dcc.Store(id=ID.PANELS_BUILT, data=lazy_tabs(with_visualization) if built else []),
        dcc.Interval(id=ID.POLL, interval=poll_ms),
        _header(title, tabs),
        html.Div(id=ID.BANNER, role="status"),
        html.Div(id=ID.TAB_NOTICE, className="tab-notice", role="status", **attributes({"data-tabs": " ".join(tabs)})),
        *start_here.panel(),  # above every tab: step 1 opens Findings, and the strip is still there
        html.Div(id=ID.panel("tensors"), className="panel", children=_tensors_panel()),
        *[html.Div(id=ID.panel(t), className="panel hidden",
                   children=_VALIDATION.get(t, _PANELS[t])() if built else None)
          for t in lazy_tabs(with_visualization)],
    ])


def _header(title: str, tabs: list[str]) -> html.Div:
    return html.Div(className="header d-flex flex-wrap align-items-center gap-3", children=[
        html.H1("comgra", className="brand"),
        html.Span(title, className="recording-path text-muted", title=title),
        # The Trial selector shares the title's row; the tabs get a row of their own, the whole width.
        _labelled("Trial", dcc.Dropdown(id=ID.TRIAL, clearable=False, searchable=True), "selector-trial", "trial"),
        dbc.Tabs(id=ID.TABS, active_tab="tensors", className="tabs",
                 children=[dbc.Tab(label=TAB_LABELS[t], tab_id=t) for t in tabs]),
    ])


def _labelled(label: str, control: Component, class_name: str = "", notice: str | None = None) -> html.Div:
    """A selector with its label, and the slot of the notices about it (filled by the view callback)."""
    slot = [_notice_slot(notice)] if notice else []
    return html.Div(className=f"selector {class_name}", children=[html.Label(label, className="form-label"), control,
                                                                   *slot])


def _notice_slot(topic: str) -> html.Div:
    return html.Div(id=ID.notice(topic), className="selector-notice", role="status",
                    **attributes({"aria-live": "polite", "data-notice": topic}))


def _tensors_panel() -> list[Component]:
    # The graph and the values side by side, so that the numbers are where the eye is (1280x800 shows both).
    return [
        _selectors(),
        html.Div(id=ID.NOTICE, className="notice selector-notice", role="status",
                 **attributes({"aria-live": "polite", "data-notice": "general"})),
        html.Div(className="workspace", children=[
            _graph_area(),
            html.Div(id=ID.VALUES, className="values", role="region", **attributes({"aria-label": "Values"})),
        ]),
        html.Div(className="plots", children=_plots()),
    ]


def _selectors() -> html.Div:
    return html.Div(className="selectors", children=[
        html.Div(className="selector-row", children=[
            _labelled("Type of recording", dcc.RadioItems(id=ID.KIND, inline=True, className="kind-radio"), notice="kind"),
            _labelled("Type of training step", dcc.Dropdown(id=ID.TYPE, clearable=False), notice="type"),
            _labelled("Batch or sample", dcc.Dropdown(id=ID.AGGREGATION, clearable=False), notice="aggregation"),
            _labelled("Role of tensor", dcc.Dropdown(id=ID.ROLE, clearable=False), notice="role"),
            html.Div(id=ID.RANK_BOX, className="selector selector-rank d-none", children=[
                html.Label("Rank", className="form-label", htmlFor=ID.RANK),
                dcc.Dropdown(id=ID.RANK, clearable=False, searchable=False), _notice_slot("rank")]),
        ]),
        html.Div(className="selector-row", children=[
            _labelled("Training step", html.Div(className="slider-with-buttons", children=[
                html.Button("◀", id=ID.STEP_PREV, className="btn btn-outline-secondary btn-sm",
                            title="Previous recorded step", **attributes({"aria-label": "Previous training step"})),
                html.Div(dcc.Slider(id=ID.STEP_SLIDER, min=0, max=0, step=1, value=0, allow_direct_input=False,
                                    updatemode="mouseup"), className="slider"),
                html.Button("▶", id=ID.STEP_NEXT, className="btn btn-outline-secondary btn-sm",
                            title="Next recorded step", **attributes({"aria-label": "Next training step"})),
                html.Label("Go to training step", htmlFor=ID.STEP_INPUT, className="visually-hidden"),
                dcc.Input(id=ID.STEP_INPUT, type="number", debounce=True, placeholder="step",
                          className="form-control form-control-sm step-input"),
                html.Span(id=ID.STEP_INFO, className="step-info text-muted"),
            ]), "selector-step", "step"),
            _labelled("Iteration", html.Div(dcc.Slider(id=ID.ITERATION, min=0, max=0, step=1, value=0,
                                                       allow_direct_input=False), className="slider"),
                      "selector-iteration", "iteration"),
        ]),
    ])


def _graph_area() -> html.Div:
    # Moving, zooming and panning happen in the browser (assets/comgra.js): these buttons have no callback.
    buttons = [html.Button(symbol, id=ID.nav(direction), className="btn btn-outline-primary btn-sm", type="button",
                           title=f"{NAVIGATION_HELP[direction]} (arrow key)",
                           **attributes({"aria-label": NAVIGATION_HELP[direction], "data-move": direction}))
               for direction, symbol in NAVIGATION.items()]
    zoom = [html.Button(symbol, className="btn btn-outline-secondary btn-sm", type="button", title=help_,
                        **attributes({"aria-label": help_, "data-zoom-step": step}))
            for step, (symbol, help_) in ZOOM.items()]
    return html.Div(className="graph-area", children=[
        html.Div(className="graph-toolbar d-flex flex-wrap align-items-center gap-2", children=[
            html.Div(buttons, className="btn-group nav-buttons", role="group", **attributes({"aria-label": "Move along the graph"})),
            html.Div(zoom, className="btn-group zoom-buttons", role="group", **attributes({"aria-label": "Zoom"})),
            html.Div([dcc.Dropdown(id=ID.SEARCH, placeholder="Find a node by name…", className="node-search",
                                   clearable=True), _notice_slot("node")], className="node-search-box"),
            legend(),
        ]),
        html.Div(id=ID.GRAPH, className="graph-scroll", role="group", **attributes({"aria-label": "Dependency graph"})),
    ])


def _plots() -> list[Component]:
    return [
        _labelled("Statistic over the recorded steps", dcc.Dropdown(
            id=ID.STATISTIC, clearable=False, value="mean",
            options=[{"label": s, "value": s} for s in PLOT_STATISTICS])),
        # Filled by callbacks: plotly.js then loads after the values are shown, not before.
        html.Div(id=ID.SERIES, className="series-plot"),
        dcc.RadioItems(id=ID.DISTRIBUTION_MODE, value="bands", inline=True, className="distribution-mode",
                       inputStyle={"marginRight": "0.3em", "marginLeft": "0.8em"},
                       options=[{"label": "Distributions across steps", "value": "bands"},
                                {"label": "Histograms (a row per step)", "value": "histograms"}]),
        # Computed only while in view (issue 34): comgra.js sets DISTRIBUTION_SHOWN as the plot scrolls in and out.
        dcc.Store(id=ID.DISTRIBUTION_SHOWN, data=False),
        dcc.Store(id=ID.PLOTS_LATER, data=[ID.SERIES, ID.HISTOGRAM]),  # plots not drawn yet (tensors.py)
        html.Div(id=ID.DISTRIBUTION, className="distribution-plot"),
        html.Div(id=ID.HISTOGRAM, className="histogram-plot"),
    ]
