"""The app's callbacks, wired tab by tab: ``register`` hands each tab's module its callbacks, and keeps the
few that belong to no tab (switching tabs, the Network and Notes tabs' contents, the poll for new data,
the custom visualization). A callback is three steps: read the inputs, ask ``service``, build components
with a pure function.

- Tensors: ``tensors`` (callbacks) and ``view_state`` (the selection state, pure functions);
- Samples, Compare, Graphs (KPIs), Profile, Breakpoints, Findings: ``samples``, ``compare``, ``kpi_view``,
  ``profile_panel``, ``breakpoints``, ``findings``.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dash import Dash, Input, Output, State, no_update

from comgra.server import compare, figures, health_view, images_view, kpi_view, panels, profile_panel, samples, tensors
from comgra.server import breakpoints as breakpoints_panel
from comgra.server import findings as findings_panel
from comgra.server import node_search, runs_view, start_here
from comgra.server.guards import guarded
from comgra.server.ids import ID, TABS
from comgra.server.view_state import selection_from
from comgra.server.visualization import VisualizationData, VisualizationFile
from comgra.service import RecordingService, visualization_selection


def register(app: Dash, service: RecordingService, visualization: VisualizationFile | None, *,
             build_panels: Callable[[str, list[str], bool], dict[str, Any]]) -> None:
    """``build_panels(active tab, tabs built, with visualization)``: the panels to build (layout.panel_contents)."""
    tensors.register(app, service)
    node_search.register(app, service)
    _register_tabs(app, with_visualization=visualization is not None)
    _register_panels(app, build_panels, with_visualization=visualization is not None)
    _register_tab_contents(app, service)
    _register_poll(app, service)
    samples.register(app, service, shown_store=ID.SHOWN, tabs=ID.TABS)
    compare.register(app, service, shown_store=ID.SHOWN, tabs=ID.TABS)
    images_view.register(app, service, tabs=ID.TABS, current_trial=ID.CURRENT_TRIAL, data_version=ID.DATA_VERSION)
    kpi_view.register(app, service, tabs=ID.TABS, current_trial=ID.CURRENT_TRIAL, data_version=ID.DATA_VERSION)
    profile_panel.register(app, service, tabs=ID.TABS, current_trial=ID.CURRENT_TRIAL, data_version=ID.DATA_VERSION)
    breakpoints_panel.register(app, service, tabs=ID.TABS, current_trial=ID.CURRENT_TRIAL)
    findings_panel.register(app, service, tabs=ID.TABS, data_version=ID.DATA_VERSION, badges=ID.BADGES, current_trial=ID.CURRENT_TRIAL)
    start_here.register(app, service, series=ID.SERIES, url=ID.URL)
    runs_view.register(app, service, tabs=ID.TABS, data_version=ID.DATA_VERSION, trial_select=ID.TRIAL)
    health_view.register(app, service, tabs=ID.TABS, current_trial=ID.CURRENT_TRIAL, data_version=ID.DATA_VERSION)
    if visualization is not None:
        _register_visualization(app, service, visualization)


def _register_tabs(app: Dash, *, with_visualization: bool) -> None:
    tabs = [t for t in TABS if with_visualization or t != "visualization"]
    app.clientside_callback(
        f"function(tab) {{ return {json.dumps(tabs)}.map(t => t === tab ? 'panel' : 'panel hidden'); }}",
        [Output(ID.panel(t), "className") for t in tabs], Input(ID.TABS, "active_tab"),
    )


def _register_panels(app: Dash, build_panels: Callable[[str, list[str], bool], dict[str, Any]], *,
                     with_visualization: bool) -> None:
    """Each tab but Tensors gets its panel when first opened; its callbacks fire then, not at load."""
    lazy = [t for t in TABS if t != "tensors" and (with_visualization or t != "visualization")]

    @app.callback([Output(ID.panel(t), "children") for t in lazy], Output(ID.PANELS_BUILT, "data"),
                  Input(ID.TABS, "active_tab"), State(ID.PANELS_BUILT, "data"), prevent_initial_call=True)
    def build(active: str, built: list[str] | None) -> Any:
        built = [t for t in built or [] if isinstance(t, str)]
        new = build_panels(active, built, with_visualization) if isinstance(active, str) else {}
        if not new:
            return [no_update] * (len(lazy) + 1)
        return [new.get(t, no_update) for t in lazy] + [built + list(new)]


def _register_tab_contents(app: Dash, service: RecordingService) -> None:
    builders: dict[str, tuple[str, Callable[[str], Any]]] = {
        ID.NETWORK: ("network", lambda trial: panels.network_tree(service.modules(trial))),
        ID.NOTES: ("notes", lambda trial: panels.notes_list(service.notes(trial))),
    }  # ID.KPIS (the Graphs tab) has controls of its own: kpi_view.register
    for component, (tab, build) in builders.items():
        _register_tab_content(app, service, component, tab, build)


def _register_tab_content(app: Dash, service: RecordingService, component: str, tab: str,
                          build: Callable[[str], Any]) -> None:
    @app.callback(Output(component, "children"), Input(ID.TABS, "active_tab"), Input(ID.CURRENT_TRIAL, "data"),
                  Input(ID.DATA_VERSION, "data"))
    def update_tab(active: str, trial: str | None, _version: str) -> Any:
        if active != tab:
            return no_update
        trial = (trial if isinstance(trial, str) else None) or next(iter(service.trials()), None)
        if trial is None:
            return panels.banners(["This recording has no trials yet."])
        return guarded(lambda: build(trial), lambda message: panels.banners([message]))


def kpi_graphs(service: RecordingService, trial: str) -> Any:
    return kpi_view.kpi_graphs(service, [trial], figures.KpiOptions())


def _register_poll(app: Dash, service: RecordingService) -> None:
    @app.callback(Output(ID.DATA_VERSION, "data"), Input(ID.POLL, "n_intervals"), State(ID.DATA_VERSION, "data"),
                  prevent_initial_call=True)
    def poll(_n: int, version: str | None) -> Any:
        current = guarded(service.data_version, lambda _message: version)
        return no_update if current == version else current


def _register_visualization(app: Dash, service: RecordingService, visualization: VisualizationFile) -> None:
    @app.callback(Output(ID.VISUALIZATION, "children"), Input(ID.TABS, "active_tab"), Input(ID.SHOWN, "data"))
    def update_visualization(active: str, shown: dict[str, Any] | None) -> Any:
        if active != "visualization":
            return no_update
        selection = selection_from(shown)
        if selection is None:
            return panels.notices(["Select a tensor in the Tensors tab first."])
        return visualization.render(visualization_selection(selection),
                                    VisualizationData(service, selection.trial, selection.training_step))
