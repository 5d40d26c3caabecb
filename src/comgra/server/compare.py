"""The Compare tab: a pinned selection beside the one the Tensors tab shows, and their difference.

Pin a selection (a trial, step, node under some lens), then change the trial or the
step in the Tensors tab: this tab shows the stored statistics of both and
``shown - pinned``. Or compare the pinned tensor with itself in another trial or at another step, chosen here
(the pinned side stays), or in one click with the other trial of the group. The data question is
:meth:`comgra.service.RecordingService.compare`.
"""
from __future__ import annotations

import math
from typing import Any

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from comgra.errors import ComgraError
from comgra.server.dom import attributes
from comgra.server.panels import COUNT_STATISTICS, number, statistic_help
from comgra.server.samples import copy_while_open
from comgra.service import PLOT_STATISTICS, Comparison, RecordingService, Selection, aggregation_label


class ID:
    PIN = "compare-pin"
    CLEAR = "compare-clear"
    PINNED = "compare-pinned"  # dcc.Store: the pinned selection (a Selection's dict)
    TRIAL = "compare-trial"  # compare the pinned tensor with itself in another trial ...
    STEP = "compare-step"  # ... and/or at another step
    OTHER = "compare-other"  # dcc.Store: that compared selection; empty: the Tensors tab's selection is compared
    OTHER_TRIAL = "compare-other-trial"  # one click: pin the shown tensor, compare it in the group's other trial
    NOTICE = "compare-notice"
    BODY = "compare-body"
    SHOWN = "compare-shown"  # dcc.Store: the Tensors tab's selection, copied in the page while this tab is open


SUMMARY = (("trial", "Trial"), ("training_step", "Training step"), ("step_type", "Type of step"),
           ("iteration", "Iteration"), ("node_id", "Node"), ("role", "Role"), ("kind", "Type of recording"),
           ("aggregation", "Batch or sample"), ("rank", "Rank"))


def panel() -> html.Div:
    return html.Div(className="compare-panel", children=[
        dcc.Store(id=ID.PINNED, storage_type="memory"),
        dcc.Store(id=ID.OTHER, storage_type="memory"),
        dcc.Store(id=ID.SHOWN, storage_type="memory"),
        html.Div(className="d-flex flex-wrap align-items-end gap-3 mb-2", children=[
            html.Button("Pin the shown selection", id=ID.PIN, className="btn btn-outline-primary btn-sm",
                        title="Keep the tensor shown in the Tensors tab; then choose another trial or step there"),
            html.Button("Compare with the other trial", id=ID.OTHER_TRIAL, style={"display": "none"},
                        className="btn btn-outline-primary btn-sm"),
            html.Div(className="selector compare-trial", children=[
                html.Label("…with the pinned tensor in trial", htmlFor=ID.TRIAL, className="form-label"),
                dcc.Dropdown(id=ID.TRIAL, clearable=True, placeholder="another trial")]),
            html.Div(className="selector compare-step", children=[
                html.Label("at training step", htmlFor=ID.STEP, className="form-label"),
                dcc.Input(id=ID.STEP, type="number", debounce=True, placeholder="step",
                          className="form-control form-control-sm")]),
            html.Button("Unpin", id=ID.CLEAR, className="btn btn-outline-secondary btn-sm"),
            html.Button("Download CSV", className="btn btn-outline-secondary btn-sm compare-csv",
                        title="The comparison as a CSV file (full precision)",
                        **attributes({"data-csv-table": "compare-table", "data-csv-name": "comgra-compare.csv"})),
        ]),
        html.Div(id=ID.NOTICE, className="selector-notice small", role="status"),
        html.Div(id=ID.BODY),
    ])


def register(app: Dash, service: RecordingService, *, shown_store: str, tabs: str) -> None:
    @app.callback(Output(ID.TRIAL, "options"), Input(tabs, "active_tab"))
    def trials(active: str) -> Any:
        return [{"label": t, "value": t} for t in service.trials()] if active == "compare" else no_update

    @app.callback(Output(ID.OTHER_TRIAL, "children"), Output(ID.OTHER_TRIAL, "style"), Input(tabs, "active_tab"),
                  Input(ID.SHOWN, "data"))
    def other_trial_button(active: str, shown: Any) -> Any:
        if active != "compare":
            return no_update, no_update
        selection = _selection(shown)
        other = other_trials(service.trials(), selection.trial) if selection is not None else []
        if len(other) != 1:  # none; or several: the trial selector beside it is the choice
            return "Compare with the other trial", {"display": "none"}
        return f"Compare with the other trial ({other[0]})", {}

    @app.callback(Output(ID.PINNED, "data"), Output(ID.OTHER, "data"), Output(ID.NOTICE, "children"),
                  Input(ID.PIN, "n_clicks"), Input(ID.CLEAR, "n_clicks"), Input(ID.OTHER_TRIAL, "n_clicks"),
                  Input(ID.TRIAL, "value"), Input(ID.STEP, "value"), State(shown_store, "data"), State(ID.PINNED, "data"),
                  prevent_initial_call=True)
    def pin(_pin: Any, _clear: Any, _other: Any, trial: Any, step: Any, shown: Any, pinned: Any) -> Any:
        selection = _selection(shown)
        if ctx.triggered_id == ID.CLEAR or selection is None:
            return None, None, ""
        if ctx.triggered_id == ID.PIN:
            return selection.to_dict(), None, ""
        if ctx.triggered_id == ID.OTHER_TRIAL:  # one click: this tensor here and in the group's other trial
            other = other_trials(service.trials(), selection.trial)
            if len(other) != 1:
                return no_update, no_update, "Choose the trial to compare with."
            return _compared(service, selection, other[0], None)
        # The pinned side stays: the trial or step chosen here is where its tensor is compared (nothing pinned yet:
        # the shown tensor is pinned first).
        trial = trial if isinstance(trial, str) else None
        step = step if type(step) is int else None  # noqa: E721 - no bools
        base = _selection(pinned) or selection
        if trial is None and step is None:
            return base.to_dict(), None, ""  # back to comparing with the Tensors tab's selection
        return _compared(service, base, trial, step)

    app.clientside_callback(copy_while_open("compare"), Output(ID.SHOWN, "data"), Input(tabs, "active_tab"),
                            Input(shown_store, "data"))

    @app.callback(Output(ID.BODY, "children"), Input(tabs, "active_tab"), Input(ID.PINNED, "data"),
                  Input(ID.SHOWN, "data"), Input(ID.OTHER, "data"))
    def update(active: str, pinned: Any, shown: Any, other: Any = None) -> Any:
        if active != "compare":
            return no_update
        first, second = _selection(pinned), _selection(other) or _selection(shown)
        if first is None:
            return html.P("Nothing pinned yet. Select a tensor in the Tensors tab, pin it here, then choose "
                          "another trial or step (or node) there: both are shown side by side.", className="text-muted")
        if second is None:
            return html.P("Select a tensor in the Tensors tab to compare it with the pinned one.", className="text-muted")
        try:
            return comparison_table(service.compare(first, second), compared=_selection(other) is not None)
        except ComgraError as error:
            return html.Div(str(error), className="alert alert-warning")


def other_trials(trials: list[str], trial: str) -> list[str]:
    return [t for t in trials if t != trial]


def _compared(service: RecordingService, pinned: Selection, trial: str | None, step: int | None) -> tuple[Any, Any, str]:
    """Pinned ``pinned``; compared: its tensor in ``trial`` at ``step`` (None: the same), with what changed."""
    try:
        view = service.counterpart(pinned, trial=trial, training_step=step)
    except ComgraError as error:
        return no_update, no_update, str(error)
    if view.selection is None:
        return pinned.to_dict(), None, " ".join([*view.notices, *view.banners])
    return pinned.to_dict(), view.selection.to_dict(), " ".join([*view.notices, *view.banners])


def comparison_table(comparison: Comparison, *, compared: bool = False) -> html.Table:
    """Summary rows (what each side is), then each statistic: pinned, shown, shown - pinned. ``compared``: the second
    side was chosen in this tab, not the Tensors tab's selection."""
    pinned, current = comparison.pinned, comparison.current
    second = "Compared" if compared else "Shown"
    head = html.Thead(html.Tr([html.Th(""), html.Th("Pinned"), html.Th(second), html.Th(f"{second} − pinned")]))
    rows = [_summary_row(key, label, pinned, current) for key, label in SUMMARY]
    aggregation = current.aggregation
    for name in PLOT_STATISTICS:
        a, b = (comparison.pinned_row or {}).get(name), (comparison.current_row or {}).get(name)
        if name == "svd_max" and not any(v is not None and math.isfinite(v) for v in (a, b)):
            continue  # only 2-D parameters have one
        count = name in COUNT_STATISTICS
        delta = comparison.deltas.get(name)
        rows.append(html.Tr([
            html.Th(name, scope="row", title=statistic_help(name, aggregation)),
            *[html.Td(number(v, count=count), className="number",
                      **attributes({"data-side": side, "data-stat": name, "data-value": repr(v)}))
              for side, v in (("pinned", a), ("shown", b), ("delta", delta))],
        ]))
    return html.Table([head, html.Tbody(rows)], id="compare-table", className="table table-sm compare")


def _summary_row(key: str, label: str, pinned: Selection, current: Selection) -> html.Tr:
    def text(selection: Selection) -> str:
        value = getattr(selection, key)
        return aggregation_label(value) if key == "aggregation" else str(value)

    a, b = text(pinned), text(current)
    return html.Tr([html.Th(label, scope="row"),
                    html.Td(a, **attributes({"data-side": "pinned", "data-field": key})),
                    html.Td(b, **attributes({"data-side": "shown", "data-field": key})),
                    html.Td("" if a == b else "differs", className="text-muted small")])


def _selection(shown: Any) -> Selection | None:
    from comgra.server.view_state import selection_from  # the one check of what the browser says it shows

    return selection_from(shown)
