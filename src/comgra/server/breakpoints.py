"""The Breakpoints tab: the trial's breakpoints with hit counts, and control of a run in progress.

Everything goes through ``comgra.breakpoints.control`` (the same functions the REST API calls): the
training process, a separate process, reads the breakpoints from the trial folder and answers the
Continue / Step / Abort buttons while it is paused.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dash import ALL, Dash, Input, Output, State, ctx, dcc, html, no_update
from dash.development.base_component import Component

from comgra.errors import ComgraError, disk_problem
from comgra.breakpoints import control
from comgra.server.doors import ApiError, check_breakpoint_target, check_state_change, trial_folder
from comgra.service import RecordingService, view_link

__all__ = ["panel", "register", "breakpoints_view"]


class ID:
    TABLE = "bp-table"
    STATE = "bp-run-state"
    MESSAGE = "bp-message"
    TARGET = "bp-target"
    CONDITION = "bp-condition"
    ADD = "bp-add"
    POLL = "bp-poll"
    ACTIONS = {"continue": "bp-continue", "step": "bp-step", "abort": "bp-abort"}
    TOGGLE = "bp-toggle"
    REMOVE = "bp-remove"
    SHOWN = "bp-shown"  # a fingerprint of what the panel shows, so that the poll re-renders only on a change


def panel() -> html.Div:
    return html.Div(className="breakpoints-panel", children=[
        dcc.Interval(id=ID.POLL, interval=1000),
        dcc.Store(id=ID.SHOWN),
        html.Div(id=ID.STATE, className="run-state mb-2", role="status"),
        html.Div(className="d-flex gap-2 mb-3", children=[
            html.Button(action.capitalize(), id=button, className="btn btn-sm btn-outline-primary", n_clicks=0,
                        disabled=True)  # enabled while the run is paused
            for action, button in ID.ACTIONS.items()]),
        html.Div(id=ID.TABLE),
        html.Div(className="d-flex gap-2 mt-3 align-items-center", children=[
            dcc.Input(id=ID.TARGET, placeholder="tensor or module, e.g. loss", type="text", debounce=False),
            dcc.Input(id=ID.CONDITION, placeholder="condition, e.g. has_nan or abs_max > 1e4", type="text",
                      style={"minWidth": "22em"}),
            html.Button("Add breakpoint", id=ID.ADD, className="btn btn-sm btn-primary", n_clicks=0)]),
        html.Div(id=ID.MESSAGE, className="bp-message small mt-2", role="alert"),
        html.P("Conditions use the metrics mean, abs_mean, std, min, max, abs_max, norm, has_nan, has_inf, "
               "grad_norm, grad_mean, grad_abs_max, grad_has_nan, step, iteration and execution_time (modules), "
               "with comparisons, and/or/not and + - * /.", className="text-muted small mt-2"),
    ])


def breakpoints_view(trial: str, trial_dir: Path) -> dict[str, Any]:
    """The table and the run state of one trial, as components (a pure function of the files), and a
    fingerprint of what they show."""
    entries = control.list_breakpoints(trial_dir)
    state = control.run_state(trial_dir)
    rows = [html.Tr([html.Td(e["id"]), html.Td(e["target"]), html.Td(html.Code(e["condition"])),
                     html.Td(str(e["hits"]), className="bp-hits"),
                     html.Td("on" if e["enabled"] else "off", className="bp-enabled"),
                     html.Td([html.Button("Disable" if e["enabled"] else "Enable", id={"type": ID.TOGGLE, "id": e["id"]},
                                          className="btn btn-sm btn-outline-secondary me-1", n_clicks=0),
                              html.Button("Remove", id={"type": ID.REMOVE, "id": e["id"]},
                                          className="btn btn-sm btn-outline-danger", n_clicks=0)])],
                    **{"data-id": e["id"]}) for e in entries]
    table = html.Table(className="table table-sm bp-list", children=[
        html.Thead(html.Tr([html.Th(h) for h in ("Id", "Target", "Condition", "Hits", "Enabled", "")])),
        html.Tbody(rows or [html.Tr(html.Td("No breakpoints.", colSpan=6, className="text-muted"))])])
    shown = [trial, entries, [state.get(k) for k in ("state", "training_step", "breakpoint", "ranks", "type_of_execution",
                                                     "notice", "reason", "target", "iteration")]]
    return {"table": table, "state": _state_line(trial, state), "fingerprint": json.dumps(shown, sort_keys=True),
            "controls_disabled": state["state"] != "paused"}


def _state_line(trial: str, state: dict[str, Any]) -> list[Component | str]:
    name = state["state"]
    if name == "finished" and state.get("reason") == "aborted":
        name = "aborted"  # ended by Abort: say so, rather than "finished" as if the training had run to its end
    line: list[Component | str] = [html.Strong(name, className=f"run-{name}", **{"data-state": name})]
    if state.get("training_step") is not None:
        line.append(f" at training step {state['training_step']}")
    if name == "aborted":
        line.append(" (stopped by Abort)")
    if name == "paused":
        target = state.get("target") if state.get("breakpoint") else None
        why = f" by breakpoint {state['breakpoint']}" if state.get("breakpoint") else " after a step"
        if target:
            why += f" ({target}: {state.get('condition') or ''})".replace(": )", ")")
        link = view_link(trial, type_of_execution=state.get("type_of_execution"), training_step=state["training_step"],
                         iteration=state.get("iteration") if target else None, node_id=target)
        line += [why, " · ", html.A("show the paused step", href=link, className="bp-paused-link")]
    if name in ("finished", "aborted", "unknown"):
        line.append(html.Span(" · Continue, Step and Abort apply only to a run paused at a breakpoint.",
                              className="text-muted small"))
    if state.get("ranks", 1) > 1:
        line.append(f" ({state['ranks']} ranks)")
    if state.get("notice"):  # e.g. breakpoints that a torch.distributed run does not check
        line.append(html.Div(str(state["notice"])[:500], className="bp-notice text-warning small"))
    return line


def register(app: Dash, service: RecordingService, *, tabs: str, current_trial: str) -> None:
    """Two callbacks: the poll shows changes made elsewhere (the training process, the REST API, another
    browser) and re-renders only when what the panel shows changed; an action (add, enable, disable,
    remove, continue, step, abort) shows its result in the same callback that performs it. They are
    separate so that a poll never supersedes an action's answer."""
    def trial_of(trial: Any) -> str | None:
        """The trial the browser names, which must be one the recording holds (None: the first one)."""
        return trial if trial is not None else next(iter(service.trials()), None)

    disabled = [Output(b, "disabled") for b in ID.ACTIONS.values()]
    keep = [no_update] * len(disabled)

    @app.callback(Output(ID.TABLE, "children"), Output(ID.STATE, "children"), Output(ID.SHOWN, "data"), *disabled,
                  Input(tabs, "active_tab"), Input(current_trial, "data"), Input(ID.POLL, "n_intervals"),
                  State(ID.SHOWN, "data"))
    def refresh(active: str, trial: Any, _: Any, shown: str | None) -> Any:
        if active != "breakpoints":
            return no_update, no_update, no_update, *keep
        trial = trial_of(trial)
        if trial is None:
            return None, "This recording has no trials yet.", None, *[True] * len(disabled)
        try:
            view = breakpoints_view(trial, trial_folder(service, trial))
        except ComgraError as error:
            return None, html.Span(str(error), className="text-danger"), None, *[True] * len(disabled)
        if view["fingerprint"] == shown:
            return no_update, no_update, no_update, *keep
        return view["table"], view["state"], view["fingerprint"], *[view["controls_disabled"]] * len(disabled)

    @app.callback(Output(ID.TABLE, "children", allow_duplicate=True), Output(ID.STATE, "children", allow_duplicate=True),
                  Output(ID.SHOWN, "data", allow_duplicate=True), Output(ID.MESSAGE, "children"),
                  *[Output(b, "disabled", allow_duplicate=True) for b in ID.ACTIONS.values()],
                  Input(ID.ADD, "n_clicks"), *[Input(b, "n_clicks") for b in ID.ACTIONS.values()],
                  Input({"type": ID.TOGGLE, "id": ALL}, "n_clicks"), Input({"type": ID.REMOVE, "id": ALL}, "n_clicks"),
                  State(current_trial, "data"), State(ID.TARGET, "value"), State(ID.CONDITION, "value"),
                  prevent_initial_call=True)
    def act(*arguments: Any) -> Any:
        trial, target, condition = trial_of(arguments[-3]), arguments[-2], arguments[-1]
        if trial is None or not ctx.triggered or not ctx.triggered[0]["value"]:
            return no_update, no_update, no_update, no_update, *keep  # a re-rendered button, not a click
        try:  # the same authorisation and the same trial check as the REST API's state-changing calls
            check_state_change()
            trial_dir = trial_folder(service, trial)
        except (ApiError, ComgraError) as error:
            return no_update, no_update, no_update, html.Span(str(error), className="text-danger"), *keep
        said = _act(trial_dir, ctx.triggered_id, target, condition,
                    check_target=lambda name: check_breakpoint_target(service, trial, name))
        message = said if said is not None else no_update
        try:
            view = breakpoints_view(trial, trial_dir)
        except ComgraError as error:  # a damaged breakpoints.json: say so, where the panel shows its table
            return None, html.Span(str(error), className="text-danger"), None, message, *[True] * len(disabled)
        return view["table"], view["state"], view["fingerprint"], message, *[view["controls_disabled"]] * len(disabled)


def _act(trial_dir: Path, trigger: Any, target: Any, condition: Any, *,
         check_target: Callable[[Any], None]) -> Component | str | None:
    """Do what the clicked control asks; an error becomes the message the user sees."""
    try:
        if trigger == ID.ADD:
            check_target(target)  # against the recording's tensors and modules, as the REST API does
            added = control.add_breakpoint(trial_dir, target, condition)
            return f"Added {added['id']}."
        for action, button in ID.ACTIONS.items():
            if trigger == button:
                control.send_command(trial_dir, action)
                return f"Sent {action}."
        if isinstance(trigger, dict) and trigger.get("type") == ID.TOGGLE:
            current = {e["id"]: e for e in control.list_breakpoints(trial_dir)}[trigger["id"]]
            control.update_breakpoint(trial_dir, trigger["id"], enabled=not current["enabled"])
            return ""
        if isinstance(trigger, dict) and trigger.get("type") == ID.REMOVE:
            control.remove_breakpoint(trial_dir, trigger["id"])
            return f"Removed {trigger['id']}."
    except (ComgraError, KeyError) as error:
        return html.Span(str(error), className="text-danger")
    except OSError as error:
        if not disk_problem(error):
            raise
        return html.Span(f"Nothing was written: {disk_problem(error)}.", className="text-danger")
    return None
