"""The app's callbacks: read the inputs, ask ``service``, build components with pure functions.

All selection state lives in the browser (the ``selection`` store): what the
user asked for (``wanted``) and what is shown (``shown``). Wanted values are
sticky preferences: a role, an aggregation or an iteration that does not apply
to the current node falls back for display, and comes back when it applies
again.

A click costs only what changes. The graph of a step's structure is sent once
per hash into a store the page keeps (``graph-documents``) and drawn, selected,
highlighted and walked by assets/comgra.js; a node click's round trip returns
the values (with their breadcrumb) and only those selector props that changed.
The page also asks for the clicked node's values on a route of its own
(``VALUES_ROUTE``), outside Dash's callback queue, and draws them as soon as
they come: the values change within one short round trip of the click, and
the view callback's answer (same values) updates the selectors and plots.
The view's link (``service.view_link``) goes to the URL on every change, and a
page opened with a link's query string shows the view it names.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from dash import ClientsideFunction, Dash, Input, Output, Patch, State, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate
from flask import Response, request

from comgra.errors import ComgraError
from comgra.server import compare, figures, kpi_view, panels, profile_panel, samples
from comgra.server import breakpoints as breakpoints_panel
from comgra.server import findings as findings_panel
from comgra.server.dom import attributes
from comgra.server.graph_view import client_graph
from comgra.server.layout import ID, TABS
from comgra.server.values_view import values_data
from comgra.server.visualization import VisualizationData, VisualizationFile
from comgra.service import (
    ANY_TYPE, NOTICE_TOPICS, PLOT_STATISTICS, ReadSuperseded, RecordingService, Selection, View, aggregation_label,
    clean_wanted, parse_aggregation, series, view_link, visualization_selection, wanted_from_query,
)

log = logging.getLogger("comgra.server")

# The inputs of the view callback: key -> (component id, property).
VIEW_INPUTS = {
    "trial": (ID.TRIAL, "value"), "kind": (ID.KIND, "value"), "type": (ID.TYPE, "value"),
    "step_index": (ID.STEP_SLIDER, "value"), "step_prev": (ID.STEP_PREV, "n_clicks"),
    "step_next": (ID.STEP_NEXT, "n_clicks"), "step_input": (ID.STEP_INPUT, "value"),
    "iteration": (ID.ITERATION, "value"), "aggregation": (ID.AGGREGATION, "value"), "role": (ID.ROLE, "value"),
    "rank": (ID.RANK, "value"), "node_click": (ID.NODE_CLICK, "data"), "search": (ID.SEARCH, "value"),
    "version": (ID.DATA_VERSION, "data"), "url": (ID.URL, "search"),
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
    "search": (ID.SEARCH, "value"),
    "graph_key": (ID.GRAPH_KEY, "data"), "graphs": (ID.GRAPHS, "data"), "graphs_known": (ID.GRAPHS_KNOWN, "data"),
    "badges": (ID.BADGES, "data"), "step_key": (ID.STEP_KEY, "data"), "link": (ID.LINK, "data"),
    "values": (ID.VALUES_DATA, "data"), "notices": (ID.NOTICES, "data"), "banner": (ID.BANNER, "children"),
}
_TRIGGER_KEYS = {component: key for key, (component, _) in VIEW_INPUTS.items()}


def register(app: Dash, service: RecordingService, visualization: VisualizationFile | None) -> None:
    _register_view(app, service)
    _register_values_route(app, service)
    _register_graph(app, service)
    _register_series(app, service)
    _register_tabs(app, with_visualization=visualization is not None)
    _register_tab_contents(app, service)
    _register_poll(app, service)
    samples.register(app, service, shown_store=ID.SHOWN, tabs=ID.TABS)
    compare.register(app, service, shown_store=ID.SHOWN, tabs=ID.TABS)
    kpi_view.register(app, service, tabs=ID.TABS, current_trial=ID.CURRENT_TRIAL, data_version=ID.DATA_VERSION)
    profile_panel.register(app, service, tabs=ID.TABS, current_trial=ID.CURRENT_TRIAL, data_version=ID.DATA_VERSION)
    breakpoints_panel.register(app, service, tabs=ID.TABS, current_trial=ID.CURRENT_TRIAL)
    findings_panel.register(app, service, tabs=ID.TABS, data_version=ID.DATA_VERSION, badges=ID.BADGES, current_trial=ID.CURRENT_TRIAL)
    if visualization is not None:
        _register_visualization(app, service, visualization)


# -- the tensors view ------------------------------------------------------------------------------
def _register_view(app: Dash, service: RecordingService) -> None:
    @app.callback(
        output={k: Output(*v) for k, v in VIEW_OUTPUTS.items()},
        inputs={k: Input(*v) for k, v in VIEW_INPUTS.items()},
        state={"previous": State(ID.SELECTION, "data"), "previous_shown": State(ID.SHOWN, "data"),
               "previous_trial": State(ID.CURRENT_TRIAL, "data"), "known": State(ID.GRAPHS_KNOWN, "data"),
               "shown_options": {key: State(*VIEW_OUTPUTS[key]) for key in _UNCHANGED_IF_EQUAL}},
    )
    def update_view(previous: dict[str, Any] | None, previous_shown: dict[str, Any] | None,
                    previous_trial: str | None, known: Any, shown_options: dict[str, Any],
                    **inputs: Any) -> dict[str, Any]:
        trigger = _TRIGGER_KEYS.get(ctx.triggered_id) if isinstance(ctx.triggered_id, str) else None
        # The browser's state may be anything a request body can hold: keep only what has the right shape.
        previous = previous if isinstance(previous, dict) else {}
        earlier = clean_wanted(previous.get("wanted"))
        try:
            shown = selection_from(previous.get("shown"))
            wanted = linked_wanted(trigger, inputs.get("url"))
            if wanted is None:
                wanted, _ = next_wanted(service, earlier, shown.to_dict() if shown else None, trigger, inputs)
            view = service.resolve(wanted)
        except Exception as error:  # noqa: BLE001 - shown as a banner; the page stays usable
            view, wanted = _failed_view(service, error), earlier
        new_trial = view.trial != previous_trial or trigger in (None, "version")
        outputs = view_outputs(view, remember(wanted, view), previous_shown,
                               known=known if isinstance(known, list) else [],
                               badges=graph_badges(service, view.trial) if new_trial else no_update)
        if not new_trial:
            outputs["current_trial"] = no_update
        prefetch_near(service, view)
        return skip_unchanged(outputs, {**shown_options, **inputs})


VALUES_ROUTE = "/_comgra/values"  # POST {"selection": the page's selection store, "node_id": ... | "trigger": ...}
EARLY_TRIGGERS = ("step_prev", "step_next")  # besides a node click: what the page asks the values route for


def _register_values_route(app: Dash, service: RecordingService) -> None:
    def answer() -> Response:  # keys in the order Dash sends them, so that the page sees the same text
        return Response(json.dumps(click_values(service, request.get_json(silent=True))), mimetype="application/json")

    app.server.add_url_rule(VALUES_ROUTE, "comgra_click_values", answer, methods=["POST"])


def click_values(service: RecordingService, body: Any) -> dict[str, Any]:
    """The values panel after a click on ``body["node_id"]``, or on the previous / next step button
    (``body["trigger"]`` in ``EARLY_TRIGGERS``), given the page's selection store
    (``body["selection"]``): the same values the view callback answers to the same click.

    ``values`` is None where there is nothing to draw early (a malformed request, a selection that
    cannot be read): the view callback's answer then says why.
    """
    body = body if isinstance(body, dict) else {}
    node_id, previous, trigger = body.get("node_id"), body.get("selection"), body.get("trigger")
    clicked = None  # the node a click named; a step button names none
    if trigger in EARLY_TRIGGERS:
        inputs: dict[str, Any] = {trigger: None}
    elif isinstance(node_id, str):
        clicked, trigger, inputs = node_id, "node_click", {"node_click": {"id": node_id}}
    else:
        return {"node_id": None, "values": None}
    previous = previous if isinstance(previous, dict) else {}
    shown = selection_from(previous.get("shown"))
    try:
        wanted, _ = next_wanted(service, clean_wanted(previous.get("wanted")), shown.to_dict() if shown else None,
                                trigger, inputs)
        view = service.resolve(wanted)
    except Exception:  # noqa: BLE001 - the view callback, asked the same, reports it
        log.debug("comgra: a click's values could not be read early", exc_info=True)
        return {"node_id": clicked, "values": None}
    if view.selection is None:
        return {"node_id": clicked, "values": None}
    prefetch_near(service, view)
    return {"node_id": clicked or view.selection.node_id, "values": values_data(view.selection, view.row)}


def prefetch_near(service: RecordingService, view: View) -> None:
    """Have the steps around the shown one read in the background (``service.prefetch_near``), so that
    the next click on a step button finds its rows kept. Never fails the answer it follows."""
    if view.selection is None:
        return
    try:
        service.prefetch_near(view.selection)
    except Exception:  # noqa: BLE001 - an extra: the next step is then read when asked for
        log.debug("comgra: the steps around the shown one could not be read ahead", exc_info=True)


def linked_wanted(trigger: str | None, query: Any) -> dict[str, Any] | None:
    """What a link asks for, when the page was just opened with one (else None: the inputs decide)."""
    if trigger not in (None, "url") or not isinstance(query, str):
        return None
    wanted = wanted_from_query(query)
    return wanted or None


def graph_badges(service: RecordingService, trial: str | None) -> dict[str, str]:
    """node id -> badge text of the trial, from the service's findings where it has them."""
    finding_badges = getattr(service, "finding_badges", None)
    if finding_badges is None or trial is None:
        return {}
    try:
        badges = finding_badges(trial)
    except Exception:  # noqa: BLE001 - a badge is an extra: the graph is drawn without it
        log.exception("comgra: the badges of trial %r could not be read", trial)
        return {}
    return {str(k): str(v) for k, v in (badges or {}).items()}


# Props that are sent only when they change: re-sending a dropdown's options or value re-renders it,
# which left Dash 4's dropdown stuck "open" (the next click only closed it); and a node click should
# carry nothing but the values.
_UNCHANGED_IF_EQUAL = ("trial_options", "kind_options", "type_options", "aggregation_options", "role_options",
                       "rank_options", "graph_key", "step_key", "link", "notices", "step_max", "step_marks",
                       "iteration_min", "iteration_max", "iteration_marks", "rank_box", "step_info")
_VALUES_IF_EQUAL = ("trial", "kind", "type", "aggregation", "role", "rank", "search", "step_index", "step_input",
                    "iteration")


def skip_unchanged(outputs: dict[str, Any], in_browser: Mapping[str, Any]) -> dict[str, Any]:
    """``no_update`` for every selector prop whose new value is what the browser already has."""
    for key in (*_UNCHANGED_IF_EQUAL, *_VALUES_IF_EQUAL):
        if key in in_browser and _as_json(outputs[key]) == in_browser[key]:
            outputs[key] = no_update
    return outputs


def _as_json(value: Any) -> Any:
    """The value as the browser holds it after a round trip (JSON object keys are strings)."""
    if isinstance(value, dict):
        return {str(k): _as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    return value


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
    if trigger is None or trigger in ("version", "url"):
        return wanted, None
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
    """The step a step button or the slider asks for; the question lives in service (adjacent_step)."""
    if not shown:
        return None
    if trigger == "step_index":  # a slider sends an int; anything else: the first
        index, offset = (value if type(value) is int else 0), 0  # noqa: E721
    else:
        index, offset = None, (1 if trigger == "step_next" else -1)
    return service.adjacent_step(shown["trial"], shown["type_of_execution"], shown["training_step"], offset=offset,
                                 index=index, rank=shown.get("rank"))


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


def view_outputs(view: View, wanted: dict[str, Any], previous_shown: dict[str, Any] | None, *,
                 known: list[Any] | None = None, badges: Any = no_update) -> dict[str, Any]:
    """Every output of the view callback, built from the service's answer; ``known``: the graph hashes
    the page already holds (their documents are not sent again)."""
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
        "search": None, "badges": badges, "step_key": step_key(selection), "link": link_of(view),
        "values": values_data(selection, view.row),
        "notices": notices_by_topic(view.notices), "banner": panels.banners(view.banners),
    }
    outputs.update(graph_outputs(view, known or []))
    outputs.update(rank_outputs(choices.ranks, selection, wanted.get("all_ranks") is True))
    outputs.update(_step_outputs(choices.steps, selection))
    outputs.update(_iteration_outputs(choices.iterations, selection))
    return outputs


def graph_outputs(view: View, known: list[Any]) -> dict[str, Any]:
    """The key of the graph shown, and its document only where the page does not hold it yet."""
    if not view.graph or view.selection is None:
        return {"graph_key": None, "graphs": no_update, "graphs_known": no_update}
    digest = str(view.graph.get("hash") or "")
    outputs: dict[str, Any] = {"graph_key": {"trial": view.trial, "hash": digest},
                               "graphs": no_update, "graphs_known": no_update}
    if digest not in known:
        documents, hashes = Patch(), Patch()
        documents[digest] = client_graph(view.graph)
        hashes.append(digest)
        outputs.update(graphs=documents, graphs_known=hashes)
    return outputs


def step_key(selection: Selection | None) -> dict[str, Any] | None:
    """What the hover cards' min / mean / max depend on; changes only with it."""
    if selection is None:
        return None
    return {"trial": selection.trial, "training_step": selection.training_step, "iteration": selection.iteration,
            "kind": selection.kind, "rank": selection.rank}


def link_of(view: View) -> str | None:
    """The link of the shown view (``service.view_link``); the page's script adds the active tab."""
    selection = view.selection
    if selection is None:
        return None
    return view_link(selection.trial, type_of_execution=None if selection.type_of_execution == ANY_TYPE
                     else selection.type_of_execution, training_step=selection.training_step,
                     iteration=selection.iteration, node_id=selection.node_id, role=selection.role,
                     kind=selection.kind, aggregation=selection.aggregation,
                     rank=selection.rank if len(view.choices.ranks) > 1 else None)


def notices_by_topic(notices: list[str]) -> dict[str, str]:
    """topic -> the text of its notices; each is shown beside the selector it concerns."""
    by_topic: dict[str, list[str]] = {}
    for notice in notices:
        topic = getattr(notice, "about", "general")
        by_topic.setdefault(topic if topic in NOTICE_TOPICS else "general", []).append(str(notice))
    return {topic: " ".join(texts) for topic, texts in by_topic.items()}


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


# -- the graph in the browser, notices, the URL ---------------------------------------------------------
def _register_graph(app: Dash, service: RecordingService) -> None:
    app.clientside_callback(
        ClientsideFunction("comgra", "renderGraph"), Output(ID.GRAPH_RENDERED, "data"),
        Input(ID.GRAPH_KEY, "data"), Input(ID.GRAPHS, "data"), Input(ID.BADGES, "data"), Input(ID.SHOWN, "data"))
    # Not an input of the renderer: Dash would hold the drawing back until the hover cards' numbers came.
    app.clientside_callback(ClientsideFunction("comgra", "setSummaries"), Output(ID.SUMMARIES_SET, "data"),
                            Input(ID.NODE_SUMMARIES, "data"))
    app.clientside_callback(ClientsideFunction("comgra", "renderValues"), Output(ID.VALUES_RENDERED, "data"),
                            Input(ID.VALUES_DATA, "data"), State(ID.SELECTION, "data"))
    app.clientside_callback(ClientsideFunction("comgra", "searchOptions"), Output(ID.SEARCH, "options"),
                            Input(ID.GRAPH_KEY, "data"), Input(ID.GRAPHS, "data"))
    app.clientside_callback(ClientsideFunction("comgra", "notices"),
                            [Output(ID.notice(topic), "children") for topic in NOTICE_TOPICS],
                            Input(ID.NOTICES, "data"))
    app.clientside_callback(ClientsideFunction("comgra", "writeUrl"), Output(ID.URL_WRITTEN, "data"),
                            Input(ID.LINK, "data"), Input(ID.TABS, "active_tab"))
    app.clientside_callback(ClientsideFunction("comgra", "tabFromUrl"), Output(ID.TABS, "active_tab"),
                            Input(ID.URL, "search"))

    # A callback of its own: the hover cards' numbers never delay the values.
    @app.callback(Output(ID.NODE_SUMMARIES, "data"), Input(ID.STEP_KEY, "data"))
    def update_summaries(key: Any) -> Any:
        if not isinstance(key, dict) or not all(type(key.get(k)) is int for k in ("training_step", "iteration", "rank")) \
                or not isinstance(key.get("trial"), str) or not isinstance(key.get("kind"), str):
            return {}
        return _guarded(lambda: finite_summaries(service.node_summaries(
            key["trial"], key["training_step"], key["iteration"], kind=key["kind"], rank=key["rank"])),
            lambda _message: {})


def finite_summaries(summaries: dict[str, dict[str, float | None]]) -> dict[str, dict[str, float | None]]:
    """NaN and infinities as None: JSON has no words for them."""
    return {node: {name: value if value is None or math.isfinite(value) else None for name, value in stats.items()}
            for node, stats in summaries.items()}


# -- series plot, tabs, polling ------------------------------------------------------------------------
def _register_series(app: Dash, service: RecordingService) -> None:
    @app.callback(Output(ID.SERIES, "children"), Input(ID.SHOWN, "data"), Input(ID.STATISTIC, "value"),
                  Input(ID.DATA_VERSION, "data"), Input(ID.RANK, "value"))
    def update_series(shown: dict[str, Any] | None, statistic: str, _version: str, rank: Any = None) -> Any:
        selection = selection_from(shown)
        if selection is None:
            return _graph(figures.empty_figure("Nothing selected."))
        statistic = statistic if statistic in PLOT_STATISTICS else "mean"
        title = series_title(selection, statistic)
        try:
            lines = series(service, selection, statistic or "mean", all_ranks=rank == ALL_RANKS)
        except ReadSuperseded:  # the user clicked on meanwhile: the newer click's plot comes instead
            raise PreventUpdate from None
        except Exception as error:  # noqa: BLE001 - shown in the plot's place, as _guarded does
            return _graph(_guarded(_raiser(error), figures.empty_figure))
        return _graph(_guarded(lambda: figures.series_figure(
            lines, title=title, current_trial=selection.trial, current_step=selection.training_step),
            figures.empty_figure))

    # A callback of its own, so that the values are shown before the plots are drawn.
    @app.callback(Output(ID.HISTOGRAM, "children"), Input(ID.SHOWN, "data"))
    def update_histogram(shown: dict[str, Any] | None) -> Any:
        selection = selection_from(shown)
        if selection is None:
            return _graph(figures.empty_figure("Nothing selected."))
        return _graph(_guarded(lambda: neuron_figure(service, selection), figures.empty_figure))


def neuron_figure(service: RecordingService, selection: Selection) -> Any:
    """A 2-D tensor's stored values as a heatmap, a few as markers, many as a histogram (figures.neuron_figure)."""
    stored = service.neuron_values(selection)
    return figures.neuron_figure(stored.values, shape=stored.shape, total=stored.total,
                                 has_batch=parse_aggregation(selection.aggregation)[0] != "none",
                                 title=f"Neuron values of {selection.node} [{selection.role}]")


def series_title(selection: Selection, statistic: str) -> str:
    """The series plot's title, in the words of the selectors (no "none", no "iteration -1")."""
    aggregation = parse_aggregation(selection.aggregation)[0]
    parts = [f"{statistic} of {selection.node} [{selection.role}]", selection.kind]
    if aggregation != "none":
        parts.append(aggregation_label(selection.aggregation).lower())
    if selection.data_iteration >= 0:
        parts.append(f"iteration {selection.data_iteration}")
    return ", ".join(parts)


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
    return service.neuron_values(selection).values  # the question lives in service; kept for older callers


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
        return _guarded(lambda: build(trial), lambda message: panels.banners([message]))


def kpi_graphs(service: RecordingService, trial: str) -> Any:
    return kpi_view.kpi_graphs(service, [trial], figures.KpiOptions())


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
        selection = selection_from(shown)
        if selection is None:
            return panels.notices(["Select a tensor in the Tensors tab first."])
        return visualization.render(visualization_selection(selection),
                                    VisualizationData(service, selection.trial, selection.training_step))


def _raiser(error: Exception) -> Callable[[], Any]:
    """A builder that raises ``error`` (for ``_guarded``, which words it for the page)."""
    def build() -> Any:
        raise error
    return build


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
