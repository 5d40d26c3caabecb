"""The Tensors tab's state, as pure functions: what the browser sent (the ``selection`` store, the inputs, a
link) turned into what the user wants next, and a resolved ``View`` turned into the props of the page.

All selection state lives in the browser: what the user asked for (``wanted``) and what is shown
(``shown``). Wanted values are sticky preferences: a role, an aggregation or an iteration that does not
apply to the current node falls back for display, and comes back when it applies again. A prop is sent
only when it changes (``skip_unchanged``). Other tabs read the shown selection through
:func:`selection_from`, the one check of what the browser says it shows.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dash import Patch, no_update

from comgra.server import node_search, panels
from comgra.server.graph_view import client_graph
from comgra.server.ids import ID
from comgra.server.values_view import DEFAULT_TYPE, values_data
from comgra.service import (
    ANY_TYPE, NOTICE_TOPICS, RecordingService, Selection, View, view_link, wanted_from_query,
)

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
TRIGGER_KEYS = {component: key for key, (component, _) in VIEW_INPUTS.items()}


def linked_wanted(trigger: str | None, query: Any) -> dict[str, Any] | None:
    """What a link asks for, when the page was just opened with one (else None: the inputs decide)."""
    if trigger not in (None, "url") or not isinstance(query, str):
        return None
    wanted = wanted_from_query(query)
    return wanted or None


# Props that are sent only when they change: re-sending a dropdown's options or value re-renders it,
# which left Dash 4's dropdown stuck "open" (the next click only closed it); and a node click should
# carry nothing but the values.
UNCHANGED_IF_EQUAL = ("trial_options", "kind_options", "type_options", "aggregation_options", "role_options",
                       "rank_options", "graph_key", "step_key", "link", "notices", "step_max", "step_marks",
                       "iteration_min", "iteration_max", "iteration_marks", "rank_box", "step_info")
_VALUES_IF_EQUAL = ("trial", "kind", "type", "aggregation", "role", "rank", "search", "step_index", "step_input",
                    "iteration")


def skip_unchanged(outputs: dict[str, Any], in_browser: Mapping[str, Any]) -> dict[str, Any]:
    """``no_update`` for every selector prop whose new value is what the browser already has."""
    for key in (*UNCHANGED_IF_EQUAL, *_VALUES_IF_EQUAL):
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
        if step is not None:  # a step is (number, type): an evaluation may share a training step's number
            wanted["training_step"], wanted["step_type"] = step
    elif trigger == "node_click" and isinstance(value, dict):
        wanted["node_id"] = value.get("id")
    elif trigger == "search" and value:
        elsewhere = node_search.parse(value)  # a node only in another iteration of this step: open that iteration
        if elsewhere is not None:
            wanted["iteration"], wanted["node_id"] = elsewhere
        else:
            wanted["node_id"] = value
    elif trigger == "step_input" and value is not None:
        wanted["training_step"] = value
        wanted.pop("step_type", None)
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


def _step_from(service: RecordingService, shown: Mapping[str, Any] | None, trigger: str,
               value: Any) -> tuple[int, str] | None:
    """The step a step button or the slider asks for; the question lives in service (adjacent_step)."""
    if not shown:
        return None
    if trigger == "step_index":  # a slider sends an int; anything else: the first
        index, offset = (value if type(value) is int else 0), 0  # noqa: E721
    else:
        index, offset = None, (1 if trigger == "step_next" else -1)
    return service.adjacent_position(shown["trial"], shown["type_of_execution"], shown["training_step"],
                                     offset=offset, index=index, rank=shown.get("rank"),
                                     step_type=shown.get("step_type"))


def remember(wanted: Mapping[str, Any], view: View) -> dict[str, Any]:
    """Keep sticky preferences; follow what is shown for trial, type, step and a moved node."""
    wanted = dict(wanted)
    selection = view.selection
    if selection is not None:
        wanted.update(trial=selection.trial, type_of_execution=selection.type_of_execution,
                      training_step=selection.training_step, step_type=selection.step_type)
        if not view.node_fallback:
            wanted["node_id"] = selection.node_id
    return wanted


def type_label(type_of_execution: str) -> str:
    """A type of step as the selector names it: the recorder's default name (no type given) in plain words."""
    return {ANY_TYPE: "Any training step", DEFAULT_TYPE: "Steps of no named type"}.get(type_of_execution,
                                                                                        type_of_execution)


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
        "type_options": [{"label": type_label(t), "value": t} for t in choices.types],
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
    outputs.update(_step_outputs(choices.steps, choices.step_types, selection))
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
            "kind": selection.kind, "rank": selection.rank, "step_type": selection.step_type}


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


def _step_outputs(steps: list[int], types: list[str], selection: Selection | None) -> dict[str, Any]:
    """The step slider: one position per step (number, type); an evaluation sharing a training step's number
    has a position of its own."""
    if not steps or selection is None:
        return {"step_max": 0, "step_marks": {}, "step_index": 0, "step_input": None, "step_info": ""}
    pairs = list(zip(steps, types))
    shown = (selection.training_step, selection.step_type)
    index = pairs.index(shown) if shown in pairs else steps.index(selection.training_step)
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
