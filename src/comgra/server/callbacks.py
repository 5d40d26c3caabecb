"""The app's callbacks: read the inputs, ask ``service``, build components with pure functions.

All selection state lives in the browser (the ``selection`` store): what the
user asked for (``wanted``) and what is shown (``shown``). Wanted values are
sticky preferences: a role, an aggregation or an iteration that does not apply
to the current node falls back for display, and comes back when it applies
again. One click costs one round trip: the view callback returns the
selectors, the graph and the values together.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from comgra.errors import ComgraError
from comgra.server import figures, panels
from comgra.server.dom import attributes
from comgra.server.graph_view import render_graph
from comgra.server.layout import ID, TABS
from comgra.server.visualization import VisualizationData, VisualizationFile
from comgra.service import (
    ANY_TYPE, DIRECTIONS, PLOT_STATISTICS, RecordingService, Selection, View, clean_wanted, parse_aggregation, series,
)

log = logging.getLogger("comgra.server")

# The inputs of the view callback: key -> (component id, property).
VIEW_INPUTS = {
    "trial": (ID.TRIAL, "value"), "kind": (ID.KIND, "value"), "type": (ID.TYPE, "value"),
    "step_index": (ID.STEP_SLIDER, "value"), "step_prev": (ID.STEP_PREV, "n_clicks"),
    "step_next": (ID.STEP_NEXT, "n_clicks"), "step_input": (ID.STEP_INPUT, "value"),
    "iteration": (ID.ITERATION, "value"), "aggregation": (ID.AGGREGATION, "value"), "role": (ID.ROLE, "value"),
    "rank": (ID.RANK, "value"), "node_click": (ID.NODE_CLICK, "data"), "search": (ID.SEARCH, "value"), "version": (ID.DATA_VERSION, "data"),
    **{f"nav_{d}": (ID.nav(d), "n_clicks") for d in DIRECTIONS},
}
VIEW_OUTPUTS = {
    "store": (ID.SELECTION, "data"), "shown": (ID.SHOWN, "data"), "current_trial": (ID.CURRENT_TRIAL, "data"),
    "trial_options": (ID.TRIAL, "options"), "trial": (ID.TRIAL, "value"),
    "kind_options": (ID.KIND, "options"), "kind": (ID.KIND, "value"),
    "type_options": (ID.TYPE, "options"), "type": (ID.TYPE, "value"),
    "step_max": (ID.STEP_SLIDER, "max"), "step_marks": (ID.STEP_SLIDER, "marks"), "step_index": (ID.STEP_SLIDER, "value"),
    "step_input": (ID.STEP_INPUT, "value"), "step_info": (ID.STEP_INFO, "children"),
    "iteration_min": (ID.ITERATION, "min"), "iteration_max": (ID.ITERATION, "max"),
    "iteration_marks": (ID.ITERATION, "marks"), "iteration": (ID.ITERATION, "value"),
    "aggregation_options": (ID.AGGREGATION, "options"), "aggregation": (ID.AGGREGATION, "value"),
    "role_options": (ID.ROLE, "options"), "role": (ID.ROLE, "value"),
    "rank_options": (ID.RANK, "options"), "rank": (ID.RANK, "value"), "rank_box": (ID.RANK_BOX, "className"),
    "search_options": (ID.SEARCH, "options"), "search": (ID.SEARCH, "value"),
    "graph": (ID.GRAPH, "children"), "values": (ID.VALUES, "children"),
    "notice": (ID.NOTICE, "children"), "banner": (ID.BANNER, "children"),
}
_TRIGGER_KEYS = {component: key for key, (component, _) in VIEW_INPUTS.items()}


def register(app: Dash, service: RecordingService, visualization: VisualizationFile | None) -> None:
    _register_view(app, service)
    _register_series(app, service)
    _register_tabs(app, with_visualization=visualization is not None)
    _register_tab_contents(app, service)
    _register_poll(app, service)
    if visualization is not None:
        _register_visualization(app, service, visualization)


# -- the tensors view ------------------------------------------------------------------------------
def _register_view(app: Dash, service: RecordingService) -> None:
    @app.callback(
        output={k: Output(*v) for k, v in VIEW_OUTPUTS.items()},
        inputs={k: Input(*v) for k, v in VIEW_INPUTS.items()},
        state={"previous": State(ID.SELECTION, "data"), "previous_shown": State(ID.SHOWN, "data"),
               "previous_trial": State(ID.CURRENT_TRIAL, "data"),
               "shown_options": {key: State(*VIEW_OUTPUTS[key]) for key in _UNCHANGED_IF_EQUAL}},
    )
    def update_view(previous: dict[str, Any] | None, previous_shown: dict[str, Any] | None,
                    previous_trial: str | None, shown_options: dict[str, Any], **inputs: Any) -> dict[str, Any]:
        trigger = _TRIGGER_KEYS.get(ctx.triggered_id) if isinstance(ctx.triggered_id, str) else None
        # The browser's state may be anything a request body can hold: keep only what has the right shape.
        previous = previous if isinstance(previous, dict) else {}
        earlier = clean_wanted(previous.get("wanted"))
        try:
            shown = selection_from(previous.get("shown"))
            wanted, move = next_wanted(service, earlier, shown.to_dict() if shown else None, trigger, inputs)
            view = service.resolve(wanted, move)
        except Exception as error:  # noqa: BLE001 - shown as a banner; the page stays usable
            view, wanted = _failed_view(service, error), earlier
        outputs = view_outputs(view, remember(wanted, view), previous_shown)
        if outputs["current_trial"] == previous_trial:
            outputs["current_trial"] = no_update
        return skip_unchanged(outputs, {**shown_options, **inputs})


# Selector props that are sent only when they change: re-sending a dropdown's options or value
# re-renders it, which left Dash 4's dropdown stuck "open" (the next click only closed it).
_UNCHANGED_IF_EQUAL = ("trial_options", "kind_options", "type_options", "aggregation_options", "role_options",
                       "rank_options")
_VALUES_IF_EQUAL = ("trial", "kind", "type", "aggregation", "role", "rank")


def skip_unchanged(outputs: dict[str, Any], in_browser: Mapping[str, Any]) -> dict[str, Any]:
    """``no_update`` for every selector prop whose new value is what the browser already has."""
    for key in (*_UNCHANGED_IF_EQUAL, *_VALUES_IF_EQUAL):
        if key in in_browser and outputs[key] == in_browser[key]:
            outputs[key] = no_update
    return outputs


# Selectors whose value in the browser is a wish when it differs from what is shown.
_SELECTOR_FIELDS = {"trial": "trial", "kind": "kind", "type": "type_of_execution", "iteration": "iteration",
                    "aggregation": "aggregation"}


def next_wanted(service: RecordingService, wanted: Mapping[str, Any], shown: Mapping[str, Any] | None,
                trigger: str | None, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """What the user asks for after an input changed; the second item is a move along the graph.

    Besides the input that fired, every selector whose value differs from what is
    shown counts: a quick second click can fire before the first one's answer
    arrived, and must not lose the first wish.
    """
    wanted = dict(wanted)
    if shown:
        _unanswered_choices(wanted, shown, inputs)
    value = inputs.get(trigger) if trigger else None
    if trigger is None or trigger == "version":
        return wanted, None
    if trigger.startswith("nav_"):
        return wanted, trigger.removeprefix("nav_")
    if trigger in ("step_index", "step_prev", "step_next"):
        step = _step_from(service, shown, trigger, value)
        if step is not None:
            wanted["training_step"] = step
    elif trigger == "node_click" and isinstance(value, dict):
        wanted["node_id"] = value.get("id")
    elif trigger == "search" and value:
        wanted["node_id"] = value
    elif trigger == "step_input" and value is not None:
        wanted["training_step"] = value
    elif trigger == "rank":
        _wanted_rank(wanted, value)
    elif trigger in _SELECTOR_FIELDS and value is not None:  # also when nothing is shown yet
        wanted[_SELECTOR_FIELDS[trigger]] = value
    return wanted, None


ALL_RANKS = "all"  # the rank selector's value for "one line per rank in the series plot"


def _wanted_rank(wanted: dict[str, Any], value: Any) -> None:
    """One rank's values; or ("all") one line per rank in the series plot, the values staying the shown rank's."""
    if value == ALL_RANKS:
        wanted["all_ranks"] = True
    elif type(value) is int:  # noqa: E721 - no bools
        wanted["rank"] = value
        wanted.pop("all_ranks", None)


def rank_outputs(ranks: list[int], selection: Selection | None, all_ranks: bool) -> dict[str, Any]:
    """The rank selector: hidden for a single-process trial, else every rank and "all ranks"."""
    if len(ranks) <= 1:
        return {"rank_options": [], "rank": None, "rank_box": "selector selector-rank d-none"}
    options = [{"label": f"Rank {r}", "value": r} for r in ranks]
    options.append({"label": "All ranks (one line each)", "value": ALL_RANKS})
    value = ALL_RANKS if all_ranks else (selection.rank if selection else None)
    return {"rank_options": options, "rank": value, "rank_box": "selector selector-rank"}


def _unanswered_choices(wanted: dict[str, Any], shown: Mapping[str, Any], inputs: Mapping[str, Any]) -> None:
    for key, field in _SELECTOR_FIELDS.items():
        value = inputs.get(key)
        if value is not None and value != shown.get(field):
            wanted[field] = value
    role = inputs.get("role")
    if role is not None and role != shown.get("role"):
        wanted["roles"] = {**(wanted.get("roles") or {}), shown["node"]: role}


def _step_from(service: RecordingService, shown: Mapping[str, Any] | None, trigger: str, value: Any) -> int | None:
    if not shown:
        return None
    steps = service.step_index(shown["trial"], shown.get("rank")).steps_of(shown["type_of_execution"]).tolist()
    if not steps:
        return None
    if trigger == "step_index":
        index = value if type(value) is int else 0  # noqa: E721 - a slider sends an int; anything else: the first
    else:
        here = steps.index(shown["training_step"]) if shown["training_step"] in steps else 0
        index = here + (1 if trigger == "step_next" else -1)
    return steps[max(0, min(len(steps) - 1, index))]


def remember(wanted: Mapping[str, Any], view: View) -> dict[str, Any]:
    """Keep sticky preferences; follow what is shown for trial, type, step and a moved node."""
    wanted = dict(wanted)
    selection = view.selection
    if selection is not None:
        wanted.update(trial=selection.trial, type_of_execution=selection.type_of_execution,
                      training_step=selection.training_step)
        if not view.node_fallback:
            wanted["node_id"] = selection.node_id
    return wanted


def view_outputs(view: View, wanted: dict[str, Any], previous_shown: dict[str, Any] | None) -> dict[str, Any]:
    """Every output of the view callback, built from the service's answer."""
    selection, choices = view.selection, view.choices
    shown = selection.to_dict() if selection else None
    outputs = {
        "store": {"wanted": wanted, "shown": shown},
        "shown": shown if shown != previous_shown else no_update,
        "current_trial": view.trial,
        "trial_options": _options(choices.trials), "trial": selection.trial if selection else wanted.get("trial"),
        "kind_options": _options(choices.kinds), "kind": selection.kind if selection else None,
        "type_options": [{"label": "Any training step" if t == ANY_TYPE else t, "value": t} for t in choices.types],
        "type": selection.type_of_execution if selection else None,
        "aggregation_options": [{"label": label, "value": value} for value, label in choices.aggregations],
        "aggregation": selection.aggregation if selection and choices.aggregations else None,
        "role_options": _options(choices.roles), "role": selection.role if selection else None,
        "search_options": [{"label": label, "value": node_id} for node_id, label in choices.nodes], "search": None,
        "graph": render_graph(view.graph, selection.node_id if selection else None, selection.role if selection else None),
        "values": panels.values_panel(selection, view.row),
        "notice": panels.notices(view.notices), "banner": panels.banners(view.banners),
    }
    outputs.update(rank_outputs(choices.ranks, selection, wanted.get("all_ranks") is True))
    outputs.update(_step_outputs(choices.steps, selection))
    outputs.update(_iteration_outputs(choices.iterations, selection))
    return outputs


def _options(values: list[str]) -> list[dict[str, str]]:
    return [{"label": v, "value": v} for v in values]


def _step_outputs(steps: list[int], selection: Selection | None) -> dict[str, Any]:
    if not steps or selection is None:
        return {"step_max": 0, "step_marks": {}, "step_index": 0, "step_input": None, "step_info": ""}
    index = steps.index(selection.training_step)
    return {"step_max": len(steps) - 1, "step_marks": slider_marks(steps), "step_index": index,
            "step_input": selection.training_step,
            "step_info": f"{selection.step_type} · {index + 1} of {len(steps)} recorded steps"}


def _iteration_outputs(iterations: list[int], selection: Selection | None) -> dict[str, Any]:
    if not iterations or selection is None:
        return {"iteration_min": 0, "iteration_max": 0, "iteration_marks": {}, "iteration": 0}
    marks = slider_marks(iterations)
    return {"iteration_min": iterations[0], "iteration_max": iterations[-1],
            "iteration_marks": {int(iterations[i]): label for i, label in marks.items()},
            "iteration": selection.iteration}


def slider_marks(values: list[int], max_marks: int | None = None) -> dict[int, str]:
    """Evenly spaced marks (index -> label) that never crowd, however many values there are."""
    if not values:
        return {}
    width = max(len(str(values[0])), len(str(values[-1])))
    limit = max_marks or max(2, min(11, 60 // (width + 2)))
    count = min(len(values), limit)
    if count == 1:
        return {0: str(values[0])}
    positions = sorted({round(i * (len(values) - 1) / (count - 1)) for i in range(count)})
    return {p: str(values[p]) for p in positions}


def _failed_view(service: RecordingService, error: Exception) -> View:
    if not isinstance(error, ComgraError):
        log.exception("comgra: the view could not be built")
    view = View()
    try:
        view.choices.trials = service.trials()
    except ComgraError:
        pass
    # A ComgraError's message says what is wrong; anything else is comgra's own fault: the details (with the
    # exception's name) go to the terminal only, the page gets a plain sentence.
    what = str(error) if isinstance(error, ComgraError) else _INTERNAL_ERROR
    view.banners.append(f"This selection could not be read: {what}. Other selections and tabs still work.")
    return view


# -- series plot, tabs, polling ------------------------------------------------------------------------
def _register_series(app: Dash, service: RecordingService) -> None:
    @app.callback(Output(ID.SERIES, "children"), Input(ID.SHOWN, "data"), Input(ID.STATISTIC, "value"),
                  Input(ID.DATA_VERSION, "data"), Input(ID.RANK, "value"))
    def update_series(shown: dict[str, Any] | None, statistic: str, _version: str, rank: Any = None) -> Any:
        selection = selection_from(shown)
        if selection is None:
            return _graph(figures.empty_figure("Nothing selected."))
        statistic = statistic if statistic in PLOT_STATISTICS else "mean"
        aggregation, sample = parse_aggregation(selection.aggregation)
        label = f"sample {sample}" if aggregation == "sample" else aggregation
        title = (f"{statistic} of {selection.node} [{selection.role}], {selection.kind}, {label}, "
                 f"iteration {selection.data_iteration}")
        return _graph(_guarded(lambda: figures.series_figure(
            series(service, selection, statistic or "mean", all_ranks=rank == ALL_RANKS), title=title, current_trial=selection.trial,
            current_step=selection.training_step), figures.empty_figure))

    # A callback of its own, so that the values are shown before the plots are drawn.
    @app.callback(Output(ID.HISTOGRAM, "children"), Input(ID.SHOWN, "data"))
    def update_histogram(shown: dict[str, Any] | None) -> Any:
        selection = selection_from(shown)
        if selection is None:
            return _graph(figures.empty_figure("Nothing selected."))
        return _graph(_guarded(lambda: figures.histogram_figure(
            neurons(service, selection), title=f"Neuron values of {selection.node} [{selection.role}]"),
            figures.empty_figure))


def selection_from(shown: Any) -> Selection | None:
    """The selection the browser says it shows, if it has exactly the fields and types of one."""
    if not isinstance(shown, dict) or set(shown) != set(_SELECTION_TYPES):
        return None
    for key, kinds in _SELECTION_TYPES.items():
        value = shown[key]
        if type(value) not in kinds or (type(value) is int and abs(value) >= 2**62):  # noqa: E721 - no bools
            return None
    return Selection(**shown)


_TYPE_NAMES = {"int": int, "str": str, "float": float, "None": type(None)}
# Field -> the exact types it accepts, from the annotations ("int | None" -> (int, NoneType)).
_SELECTION_TYPES = {f.name: tuple(_TYPE_NAMES.get(t.strip(), str) for t in str(f.type).split("|"))
                    for f in dataclasses.fields(Selection)}


def _graph(figure: Any) -> Any:
    return dcc.Graph(figure=figure, config={"displaylogo": False})


def neurons(service: RecordingService, selection: Selection) -> list[float]:
    aggregation, sample = parse_aggregation(selection.aggregation)
    table = service.tensor_rows(selection.trial, selection.training_step, columns=["neurons"], kind=selection.kind,
                                iteration=selection.data_iteration, node=selection.node, role=selection.role,
                                aggregation=aggregation, sample=sample)
    return table.column("neurons")[0].as_py() if table.num_rows else []


def _register_tabs(app: Dash, *, with_visualization: bool) -> None:
    tabs = [t for t in TABS if with_visualization or t != "visualization"]
    app.clientside_callback(
        f"function(tab) {{ return {json.dumps(tabs)}.map(t => t === tab ? 'panel' : 'panel hidden'); }}",
        [Output(ID.panel(t), "className") for t in tabs], Input(ID.TABS, "active_tab"),
    )


def _register_tab_contents(app: Dash, service: RecordingService) -> None:
    builders: dict[str, tuple[str, Callable[[str], Any]]] = {
        ID.NETWORK: ("network", lambda trial: panels.network_tree(service.modules(trial))),
        ID.NOTES: ("notes", lambda trial: panels.notes_list(service.notes(trial))),
        ID.KPIS: ("graphs", lambda trial: kpi_graphs(service, trial)),
    }
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
        return _guarded(lambda: build(trial), lambda message: panels.banners([message]))


def kpi_graphs(service: RecordingService, trial: str) -> Any:
    entries = figures.kpi_figures(service.kpis(trial))
    if not entries:
        return html.P("No KPIs in this trial (record_kpi_in_graph was not called).", className="text-muted")
    return [html.Div(dcc.Graph(figure=figure, config={"displaylogo": False}), className="kpi-graph",
                     **attributes({"data-kpi-group": group})) for group, figure in entries]


def _register_poll(app: Dash, service: RecordingService) -> None:
    @app.callback(Output(ID.DATA_VERSION, "data"), Input(ID.POLL, "n_intervals"), State(ID.DATA_VERSION, "data"),
                  prevent_initial_call=True)
    def poll(_n: int, version: str | None) -> Any:
        current = _guarded(service.data_version, lambda _message: version)
        return no_update if current == version else current


def _register_visualization(app: Dash, service: RecordingService, visualization: VisualizationFile) -> None:
    @app.callback(Output(ID.VISUALIZATION, "children"), Input(ID.TABS, "active_tab"), Input(ID.SHOWN, "data"))
    def update_visualization(active: str, shown: dict[str, Any] | None) -> Any:
        if active != "visualization":
            return no_update
        if selection_from(shown) is None:
            return panels.notices(["Select a tensor in the Tensors tab first."])
        aggregation, sample = parse_aggregation(shown["aggregation"])
        selection = {"trial": shown["trial"], "training_step": shown["training_step"],
                     "type_of_execution": shown["step_type"], "kind": shown["kind"], "iteration": shown["iteration"],
                     "node": shown["node"], "role": shown["role"], "aggregation": aggregation, "sample": sample}
        return visualization.render(selection, VisualizationData(service, shown["trial"], shown["training_step"]))


def _guarded(build: Callable[[], Any], on_error: Callable[[str], Any]) -> Any:
    """Run a builder; a failure becomes a message in the page instead of a broken callback."""
    try:
        return build()
    except ComgraError as error:
        return on_error(str(error))
    except Exception as error:
        log.exception("comgra: a callback failed")  # the details for the terminal, a summary for the page
        return on_error(f"This could not be shown: {_INTERNAL_ERROR}.")


_INTERNAL_ERROR = "comgra hit an internal error (the terminal that runs the app shows the details)"
