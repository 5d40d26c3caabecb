"""The values beside the graph, as plain data that assets/comgra.js draws: a one-line breadcrumb of the
selection, the statistics and the neurons.

Plain data rather than Dash components: a node click's answer is then a few kilobytes of numbers that
the page draws in a millisecond, not hundreds of components for the server to build and serialise
and for the page to diff. Every part of the breadcrumb that names a selection field becomes an element
with ``data-field`` (and, where the text is a label, the raw value in ``data-value``); every statistic
and neuron carries its exact value (Python's repr of the stored float) in ``data-value``, so tests and
scripts read what the page shows without parsing formatted text.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from comgra.server import panels
from comgra.server.figures import DEFAULT_TYPE
from comgra.service import Selection, aggregation_label
from comgra.store import format as fmt


def values_data(selection: Selection | None, row: dict[str, Any] | None) -> dict[str, Any]:
    """What the values panel shows, for ``renderValues`` in assets/comgra.js."""
    if selection is None:
        return {"empty": "Nothing to show yet."}
    data: dict[str, Any] = {"crumbs": breadcrumb(selection, row)}
    if row is None:
        data["missing"] = "No values were recorded for this selection."
        return data
    data["stats"] = statistics(row, selection.aggregation)
    data["neurons"] = neurons(row)
    return data


def shape_text(shape: list[int] | None) -> str:
    return "scalar" if shape == [] else ("–" if shape is None else " × ".join(map(str, shape)))


def breadcrumb(selection: Selection, row: dict[str, Any] | None) -> list[list[dict[str, Any]]]:
    """node [role] › kind · aggregation › step 120 (type) › iteration 2 › tensor type · shape › trial.

    The node first: a narrow column wraps the line, and what was clicked is read first.
    """
    aggregation = aggregation_label(selection.aggregation, row.get("category") if row else None)
    role = ([_text(" ["), _field("role", selection.role), _text("]")] if selection.role != selection.node
            else [_field("role", selection.role, hidden=True)])  # a parameter's role is its own name
    # The recorder's default type of step says nothing to a reader: kept for the page's state, not shown.
    step_type = ([_text(" ("), _field("type_of_execution", selection.step_type), _text(")")]
                 if selection.step_type != DEFAULT_TYPE else [_field("type_of_execution", selection.step_type, hidden=True)])
    return [
        [_field("node", selection.node, strong=True), *role],
        [_field("kind", selection.kind), _text(" · "), _field("aggregation", aggregation, raw=selection.aggregation)],
        [_text("step "), _field("training_step", selection.training_step), *step_type],
        [_text("iteration "), _field("iteration", selection.iteration, raw=str(selection.data_iteration))],
        [_field("tensor_type", row.get("tensor_type") if row else "–"), _text(" · "),
         _field("shape", shape_text(row.get("shape") if row else None))],
        [_field("trial", selection.trial)],
    ]


def statistics(row: dict[str, Any], aggregation: str) -> list[dict[str, str]]:
    svd = row.get("svd_max")
    names = [*fmt.STATISTICS, *(["svd_max"] if svd is not None and not math.isnan(svd) else [])]
    explain = getattr(panels, "statistic_help", None)
    return [{"name": name, "text": panels.number(row.get(name), count=name in panels.COUNT_STATISTICS),
             "value": repr(row.get(name)), "help": explain(name, aggregation) if explain else name}
            for name in names]


def neurons(row: dict[str, Any]) -> dict[str, Any]:
    values: Sequence[float] = row.get("neurons") or []
    total = row.get("num_neurons") or len(values)
    shown = list(values[:panels.MAX_NEURON_ROWS])
    scale = max((abs(v) for v in shown if math.isfinite(v)), default=0.0) or 1.0
    caption = f"{len(shown)} of {total} values" + (" (the first ones stored by the recorder)" if total > len(shown) else "")
    items = []
    for value in shown:
        width = min(50.0, abs(value) / scale * 50.0) if math.isfinite(value) else 0.0
        items.append([repr(value), panels.number(value), round(width, 1), value >= 0])
    return {"caption": caption, "items": items}


def _text(text: str) -> dict[str, Any]:
    return {"text": text}


def _field(name: str, value: Any, *, raw: str | None = None, strong: bool = False,
           hidden: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"field": name, "text": str(value)}
    if raw is not None:
        entry["raw"] = raw
    if strong:
        entry["strong"] = True
    if hidden:
        entry["hidden"] = True
    return entry
