"""Pure builders for the output panels: values, notices, banners, network tree, notes.

Numbers are shown rounded, and every number also carries its exact value in
``data-value`` (Python's repr of the stored float), so tests and scripts can
read what the page shows without parsing formatted text.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dash import html
from dash.development.base_component import Component

from comgra.server.dom import attributes
from comgra.service import Selection, aggregation_label, parse_aggregation
from comgra.store import format as fmt

MAX_NEURON_ROWS = 512
COUNT_STATISTICS = ("nan_count", "inf_count")


def number(value: float | None, *, count: bool = False) -> str:
    if value is None:
        return "–"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{int(value)}" if count else f"{value:.6g}"


def values_panel(selection: Selection | None, row: dict[str, Any] | None) -> html.Div:
    """Summary, statistics and single neurons of the selected tensor."""
    if selection is None:
        return html.Div("Nothing to show yet.", className="text-muted")
    parts: list[Any] = [html.H2("Selected tensor", className="h6"), summary_table(selection, row)]
    if row is None:
        parts.append(html.P("No values were recorded for this selection.", className="text-muted"))
        return html.Div(parts)
    parts += [html.H2("Statistics", className="h6"), statistics_table(row, selection.aggregation),
              html.H2("Neurons", className="h6"), neurons_list(row)]
    return html.Div(parts)


def summary_table(selection: Selection, row: dict[str, Any] | None) -> html.Table:
    shape = row.get("shape") if row else None
    fields = [
        ("trial", "Trial", selection.trial),
        ("training_step", "Training step", selection.training_step),
        ("iteration", "Iteration", selection.iteration),
        ("type_of_execution", "Type of step", selection.step_type),
        ("node", "Node", selection.node),
        ("role", "Role", selection.role),
        ("tensor_type", "Kind of tensor", row.get("tensor_type") if row else "–"),
        ("kind", "Type of recording", selection.kind),
        ("aggregation", "Batch or sample", aggregation_label(selection.aggregation, row.get("category") if row else None)),
        ("shape", "Shape", "scalar" if shape == [] else ("–" if shape is None else " × ".join(map(str, shape)))),
    ]
    raw = {"aggregation": selection.aggregation, "iteration": str(selection.data_iteration)}
    body = [html.Tr([html.Th(label, scope="row"),
                     html.Td(str(value), **attributes({"data-field": key, **({"data-value": raw[key]} if key in raw else {})}))])
            for key, label, value in fields]
    return html.Table(html.Tbody(body), id="summary-table", className="table table-sm summary")


# What each statistic is over the values of one sample (or of the whole tensor without a batch dimension).
STATISTIC_MEANING = {
    "mean": "the mean of the values", "abs_mean": "the mean of the absolute values",
    "std": "the standard deviation of the values", "min": "the smallest value", "max": "the largest value",
    "abs_max": "the largest absolute value", "nan_count": "the number of NaN values",
    "inf_count": "the number of infinite values", "svd_max": "the largest singular value (a 2-D parameter)",
}
# How the recorder turns the per-sample statistics into the row of a batch aggregation.
_OVER_THE_BATCH = {"mean": "the mean over the batch", "std": "the standard deviation over the batch",
                   "abs_max": "the largest absolute value over the batch"}


def statistic_help(statistic: str, aggregation: str) -> str:
    """A tooltip that says what a statistic is under an aggregation: "min" under "Mean over the batch" is
    the batch mean of each sample's minimum, not the minimum of the batch mean."""
    what = STATISTIC_MEANING.get(statistic, statistic)
    kind, sample = parse_aggregation(aggregation)
    if kind == "sample":
        return f"{statistic}: {what} of sample {sample}."
    if kind in _OVER_THE_BATCH:
        return (f"{statistic} under {aggregation_label(aggregation)!r}: {_OVER_THE_BATCH[kind]} of each sample's "
                f"{statistic} ({what} of one sample's values), not the {statistic} of one combined tensor.")
    return f"{statistic}: {what} of the tensor (it has no batch dimension)."


def statistics_table(row: dict[str, Any], aggregation: str = "none") -> html.Table:
    svd = row.get("svd_max")
    names = [*fmt.STATISTICS, *(["svd_max"] if svd is not None and not math.isnan(svd) else [])]
    body = []
    for name in names:
        value = row.get(name)
        text = number(value, count=name in COUNT_STATISTICS)
        body.append(html.Tr([html.Th(name, scope="row", title=statistic_help(name, aggregation),
                                     className="statistic-name"),
                             html.Td(text, id=f"stat-{name}", className="number",
                                     **attributes({"data-stat": name, "data-value": repr(value)}))]))
    return html.Table(html.Tbody(body), id="statistics-table", className="table table-sm statistics")


def neurons_list(row: dict[str, Any]) -> html.Div:
    values: Sequence[float] = row.get("neurons") or []
    total = row.get("num_neurons") or len(values)
    shown = values[:MAX_NEURON_ROWS]
    scale = max((abs(v) for v in shown if math.isfinite(v)), default=0.0) or 1.0
    items = [_neuron(i, v, scale) for i, v in enumerate(shown)]
    caption = f"{len(shown)} of {total} values" + (" (the first ones stored by the recorder)" if total > len(shown) else "")
    return html.Div([html.P(caption, className="text-muted small"),
                     html.Div(items, id="neurons", className="neurons")])


def _neuron(index: int, value: float, scale: float) -> html.Div:
    finite = math.isfinite(value)
    width = min(50.0, abs(value) / scale * 50.0) if finite else 0.0
    bar_style = {"width": f"{width:.1f}%", "left": "50%" if value >= 0 else f"{50 - width:.1f}%"}
    return html.Div(className="neuron", children=[
        html.Span(str(index), className="neuron-index"),
        html.Span(html.Span(className=f"bar {'positive' if value >= 0 else 'negative'}", style=bar_style),
                  className="neuron-bar"),
        html.Span(number(value), className="neuron-value number"),
    ], **attributes({"data-neuron": str(index), "data-value": repr(value)}))


def notices(messages: Sequence[str]) -> list[Any]:
    return [html.Div(m, className="alert alert-info py-1 px-2 mb-1 small") for m in messages]


def banners(messages: Sequence[str]) -> list[Any]:
    return [html.Div(m, className="alert alert-warning py-2 mb-2", role="alert") for m in messages]


def network_tree(modules: Sequence[dict[str, Any]]) -> Component:
    if not modules:
        return html.P("No modules were tracked in this trial (track_module was not called).", className="text-muted")
    return html.Div([_module(m, depth=0) for m in modules], className="network-tree")


def _module(module: dict[str, Any], depth: int) -> html.Details:
    parameters = [
        html.Li([html.Code(p.get("name", "?")), f"  {' × '.join(map(str, p.get('shape') or [])) or 'scalar'}",
                 f"  ({int(p.get('numel') or 0):,} parameters)", "" if p.get("requires_grad", True) else "  frozen",
                 f"  tied to {p['tied_to']}" if isinstance(p.get("tied_to"), str) else ""],
                className="parameter", **attributes({"data-parameter": p.get("full_name", "")}))
        for p in module.get("parameters") or []
    ]
    children = [_module(child, depth + 1) for child in module.get("submodules") or []]
    summary = html.Summary([html.Strong(module.get("name", "?")), f"  {module.get('total', 0):,} parameters"],
                           **attributes({"data-module": module.get("full_name", ""), "data-total": str(module.get("total", 0))}))
    return html.Details([summary, html.Ul(parameters), *children], open=depth < 2, className="module")


def notes_list(notes: Sequence[str]) -> Component:
    if not notes:
        return html.P("No notes in this trial (add_note was not called).", className="text-muted")
    return html.Ol([html.Li(html.Pre(note, className="note")) for note in notes], className="notes-list")
