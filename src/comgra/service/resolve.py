"""Resolving a selection: what the user asked for (any field may be missing or stale) turned into a
:class:`~comgra.service.selection.Selection` that exists, with the valid choices around it and what
had to change (``notices``), one selector at a time. No torch, no Dash.

    >>> view = resolve(trials, StepReads(trials), {"node_id": "input", "aggregation": "sample:0"})  # doctest: +SKIP
    >>> view.row["mean"], view.notices                                                        # doctest: +SKIP
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from comgra.errors import StoreError
from comgra.service.selection import (
    ANY_TYPE, Notice, Selection, View, aggregation_label, aggregation_value, clean_wanted,
)
from comgra.service.steps import StepIndex, StepReads
from comgra.service.trials import TrialQuestions
from comgra.store import format as fmt


def resolve(trials: TrialQuestions, reads: StepReads, wanted: Mapping[str, Any]) -> View:
    """Turn what the user asked for into a selection that exists, saying what had to change.

    ``wanted`` may hold trial, type_of_execution, training_step, iteration, node_id,
    roles ({node: role}), kind and aggregation; a missing key means "the default".
    Moving along the graph happens in the browser (assets/comgra.js), which then asks for a node.
    """
    view = View()
    wanted = clean_wanted(wanted, view)
    view.choices.trials = trials.trials()
    trial_id = view.trial = _pick_trial(view, wanted.get("trial"))
    if trial_id is None:
        return view
    try:
        view.choices.ranks = trials.ranks(trial_id)
        rank = _pick(view, wanted.get("rank"), view.choices.ranks, view.choices.ranks[0], "rank", "rank")
        index = reads.step_index(trial_id, rank)
    except StoreError as error:
        view.banners.append(str(error))
        return view
    if len(index.steps) == 0:
        view.banners.append(f"Trial {trial_id!r} has no recorded steps yet. If a run is writing it, "
                            "they appear here as soon as it flushes.")
    else:
        try:
            _resolve_step(trials, reads, view, trial_id, index, wanted, rank)
        except StoreError as error:  # a damaged graph or chunk of this step: say so; other steps still work
            view.selection, view.graph, view.row = None, None, None
            view.banners.append(f"{error} Other steps and trials still work.")
    view.banners.extend(trials.problems(trial_id))  # after reading, so that damage found now is reported
    return view


def _resolve_step(trials: TrialQuestions, reads: StepReads, view: View, trial_id: str, index: StepIndex,
                  wanted: Mapping[str, Any], rank: int) -> None:
    choices = view.choices
    choices.types = [ANY_TYPE, *index.types_of_execution()]
    type_ = _pick(view, wanted.get("type_of_execution"), choices.types, ANY_TYPE, "type of training step", "type")
    positions = index.positions(type_)  # the step slider's: a step is (number, type)
    choices.steps, choices.step_types = [p[0] for p in positions], [p[1] for p in positions]
    step = _pick_step(view, wanted.get("training_step"), index.steps_of(type_).tolist(), type_)
    # A step is (number, type): with any type, a number that an evaluation shares with a training step shows the
    # wanted step_type (the step slider's choice), else the main type (see StepIndex.rows_of).
    shared = index.types_at(step) if type_ == ANY_TYPE else [type_]
    rows = index.rows_of(step, wanted.get("step_type") if wanted.get("step_type") in shared else type_)
    choices.iterations = [r["iteration"] for r in rows]
    iteration = _pick_iteration(view, wanted.get("iteration"), choices.iterations, step)
    step_row = rows[choices.iterations.index(iteration)]
    graph = trials.trial(trial_id).graph(step_row["graph"])
    view.graph = graph
    node = _pick_node(view, graph, wanted.get("node_id"), iteration)
    data_iteration = node_data_iteration(node, iteration)
    recorded = reads.node_rows(trial_id, index, step, iteration=data_iteration, node=node["node"], rank=rank,
                               type_of_execution=step_row["type_of_execution"])
    base = {"trial": trial_id, "type_of_execution": type_, "training_step": step,
            "step_type": step_row["type_of_execution"], "iteration": iteration, "node_id": node["id"],
            "node": node["node"], "data_iteration": data_iteration, "rank": rank}
    _resolve_tensor(view, base, node, recorded, wanted)


# -- resolution, one selector at a time -----------------------------------------------------------------
def _pick(view: View, wanted: Any, valid: list[Any], default: Any, what: str, about: str = "general") -> Any:
    if wanted is None or wanted in valid:
        return default if wanted is None else wanted
    view.notices.append(Notice(f"The {what} {wanted!r} is not recorded here; showing {default!r}.", about))
    return default


def _pick_trial(view: View, wanted: str | None) -> str | None:
    trials = view.choices.trials
    if not trials:
        view.banners.append("This recording has no trials yet. If a run is writing it, "
                            "they appear here as soon as it has written its metadata.")
        return None
    if wanted is not None and wanted not in trials:
        view.notices.append(Notice(f"Trial {wanted!r} is not in this recording; showing {trials[0]!r}.", "trial"))
        wanted = None
    return wanted or trials[0]


def _pick_step(view: View, wanted: int | None, steps: list[int], type_: str) -> int:
    if wanted is None:
        return steps[0]
    if wanted in steps:
        return int(wanted)
    nearest = steps[int(np.argmin(np.abs(np.asarray(steps) - wanted)))]
    kind = "recorded" if type_ == ANY_TYPE else f"a {type_!r} step"
    view.notices.append(Notice(f"Training step {wanted} is not {kind}; showing the nearest one, {nearest}.", "step"))
    return nearest


def _pick_iteration(view: View, wanted: int | None, iterations: list[int], step: int) -> int:
    if wanted is None:
        return iterations[0]
    if wanted in iterations:
        return int(wanted)
    shown = iterations[-1] if wanted > iterations[-1] else iterations[0]
    view.notices.append(Notice(f"Training step {step} has iterations {iterations[0]} to {iterations[-1]}; "
                               f"showing iteration {shown} instead of {wanted}.", "iteration"))
    return shown


def _pick_node(view: View, graph: fmt.GraphDocument, wanted: str | None, iteration: int) -> fmt.GraphNode:
    node = _node_by_id(graph, wanted) if wanted else None
    if node is None and wanted:
        name = wanted.removesuffix("*old")
        node = next((n for n in graph["nodes"] if n["node"] == name), None)
        shown = node or _default_node(graph)
        view.node_fallback = True
        view.notices.append(Notice(f"Node {wanted!r} does not exist in iteration {iteration} of this step; "
                                   f"showing {shown['id']!r}.", "node"))
        return shown
    return node or _default_node(graph)


def _default_node(graph: fmt.GraphDocument) -> fmt.GraphNode:
    ordered = sorted(graph["nodes"], key=lambda n: (n["role"] != "input", n["column"], n["row"]))
    return ordered[0]


def _node_by_id(graph: fmt.GraphDocument, node_id: str | None) -> fmt.GraphNode | None:
    return next((n for n in graph["nodes"] if n["id"] == node_id), None)


def node_data_iteration(node: fmt.GraphNode, iteration: int) -> int:
    absolute = node.get("absolute_iteration")
    return int(absolute) if absolute is not None else iteration + int(node.get("iteration_offset") or 0)


def _resolve_tensor(view: View, base: dict[str, Any], node: fmt.GraphNode, rows: list[dict[str, Any]],
                    wanted: Mapping[str, Any]) -> None:
    """Pick role, kind and aggregation among the rows that exist for the node."""
    choices = view.choices
    name = node["node"]
    choices.roles = [r for r in node.get("roles") or [] if any(row["role"] == r for row in rows)]
    choices.roles += sorted({row["role"] for row in rows} - set(choices.roles))
    if not rows:
        choices.roles = list(node.get("roles") or [])
        view.notices.append(f"No values were recorded for {name!r} at step {base['training_step']}, "
                            f"iteration {base['data_iteration']}.")
        view.selection = Selection(**base, role=(choices.roles or [""])[0], kind=fmt.FORWARD, aggregation="none")
        return
    wanted_role = (wanted.get("roles") or {}).get(name)
    role = _pick(view, wanted_role, choices.roles, choices.roles[0], f"role of {name!r}", "role")
    of_role = [r for r in rows if r["role"] == role]
    choices.kinds = sorted({r["kind"] for r in of_role}, key=lambda k: (k != fmt.FORWARD, k))
    kind = _pick_kind(view, wanted.get("kind"), choices.kinds, name, role)
    candidates = [r for r in of_role if r["kind"] == kind]
    choices.aggregations = _aggregation_choices(candidates)
    aggregation = _pick_aggregation(view, wanted.get("aggregation"), [v for v, _ in choices.aggregations], name)
    view.row = next(r for r in candidates if aggregation_value(r["aggregation"], r["sample"]) == aggregation)
    view.selection = Selection(**base, role=role, kind=kind, aggregation=aggregation)


def _pick_kind(view: View, wanted: str | None, kinds: list[str], node: str, role: str) -> str:
    default = fmt.FORWARD if fmt.FORWARD in kinds else kinds[0]
    if wanted is None or wanted in kinds:
        return default if wanted is None else wanted
    view.notices.append(Notice(f"No {wanted!r} values were recorded for {node!r} (role {role!r}), e.g. an input "
                               f"or a frozen parameter; showing {default!r}.", "kind"))
    return default


def _aggregation_choices(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    order = {"mean": 0, "std": 1, "abs_max": 2, "sample": 3, "none": 4}
    ordered = sorted(rows, key=lambda r: (order.get(r["aggregation"], 5), r["sample"]))
    values = {aggregation_value(r["aggregation"], r["sample"]): r.get("category") for r in ordered}
    return [(value, aggregation_label(value, category)) for value, category in values.items()]


def _pick_aggregation(view: View, wanted: str | None, valid: list[str], node: str) -> str:
    default = "mean" if "mean" in valid else valid[0]
    if wanted is None or wanted in valid:
        return default if wanted is None else wanted
    if valid == ["none"]:
        reason = f"{node!r} has no batch dimension"
    else:
        reason = f"{aggregation_label(wanted)} was not recorded for {node!r} at this step"
    view.notices.append(Notice(f"{reason}; showing {aggregation_label(default)!r}.", "aggregation"))
    return default

