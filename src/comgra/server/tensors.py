"""The Tensors tab's callbacks: the view (selectors, graph, values), the values route, the graph's hover
cards, the series plot and the neuron values. Each reads its inputs, asks ``service``, and builds its
answer with the pure functions of ``view_state`` and ``figures``.

A click costs only what changes. The graph of a step's structure is sent once per hash into a store
the page keeps (``graph-documents``) and drawn, selected, highlighted and walked by assets/comgra.js;
a node click's round trip returns the values (with their breadcrumb) and only those selector props
that changed. The page also asks for the clicked node's values on a route of its own
(``VALUES_ROUTE``), outside Dash's callback queue, and draws them as soon as they come: the values
change within one short round trip of the click, and the view callback's answer (same values) updates
the selectors and plots. The view's link (``service.view_link``) goes to the URL on every change, and
a page opened with a link's query string shows the view it names.
"""
from __future__ import annotations

import json
import logging
import math
from typing import Any
from urllib.parse import parse_qs

from dash import ClientsideFunction, Dash, Input, Output, State, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate
from flask import Response, request

from comgra.errors import ComgraError
from comgra.server import figures
from comgra.server.guards import INTERNAL_ERROR, guarded, raiser
from comgra.server.ids import ID
from comgra.server.values_view import values_data
from comgra.service.distributions import distributions, histograms
from comgra.server.view_state import (
    TRIGGER_KEYS, UNCHANGED_IF_EQUAL, ALL_RANKS, VIEW_INPUTS, VIEW_OUTPUTS, linked_wanted, next_wanted, remember,
    selection_from, skip_unchanged, view_outputs,
)
from comgra.service import (
    NOTICE_TOPICS, PLOT_STATISTICS, ReadSuperseded, RecordingService, Selection, View, aggregation_label,
    clean_wanted, parse_aggregation, series,
)

log = logging.getLogger("comgra.server")


def register(app: Dash, service: RecordingService) -> None:
    _register_view(app, service)
    _register_values_route(app, service)
    _register_graph(app, service)
    _register_series(app, service)


# -- the tensors view ------------------------------------------------------------------------------
def _register_view(app: Dash, service: RecordingService) -> None:
    @app.callback(
        output={k: Output(*v) for k, v in VIEW_OUTPUTS.items()},
        inputs={k: Input(*v) for k, v in VIEW_INPUTS.items()},
        state={"previous": State(ID.SELECTION, "data"), "previous_shown": State(ID.SHOWN, "data"),
               "previous_trial": State(ID.CURRENT_TRIAL, "data"), "known": State(ID.GRAPHS_KNOWN, "data"),
               "shown_options": {key: State(*VIEW_OUTPUTS[key]) for key in UNCHANGED_IF_EQUAL}},
    )
    def update_view(previous: dict[str, Any] | None, previous_shown: dict[str, Any] | None,
                    previous_trial: str | None, known: Any, shown_options: dict[str, Any],
                    **inputs: Any) -> dict[str, Any]:
        trigger = TRIGGER_KEYS.get(ctx.triggered_id) if isinstance(ctx.triggered_id, str) else None
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
    what = str(error) if isinstance(error, ComgraError) else INTERNAL_ERROR
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
                            Input(ID.GRAPH_KEY, "data"), Input(ID.GRAPHS, "data"), Input(ID.SEARCH_ELSEWHERE, "data"))
    app.clientside_callback(ClientsideFunction("comgra", "notices"),
                            [Output(ID.notice(topic), "children") for topic in NOTICE_TOPICS],
                            Input(ID.NOTICES, "data"))
    app.clientside_callback(ClientsideFunction("comgra", "writeUrl"), Output(ID.URL_WRITTEN, "data"),
                            Input(ID.LINK, "data"), Input(ID.TABS, "active_tab"))
    app.clientside_callback(ClientsideFunction("comgra", "tabFromUrl"),
                            [Output(ID.TABS, "active_tab"), Output(ID.TAB_NOTICE, "children")], Input(ID.URL, "search"))
    app.clientside_callback(ClientsideFunction("comgra", "clearTabNotice"),
                            Output(ID.TAB_NOTICE, "children", allow_duplicate=True), Input(ID.TABS, "active_tab"),
                            prevent_initial_call=True)

    # A callback of its own: the hover cards' numbers never delay the values.
    @app.callback(Output(ID.NODE_SUMMARIES, "data"), Input(ID.STEP_KEY, "data"))
    def update_summaries(key: Any) -> Any:
        if not isinstance(key, dict) or not all(type(key.get(k)) is int for k in ("training_step", "iteration", "rank")) \
                or not isinstance(key.get("trial"), str) or not isinstance(key.get("kind"), str):
            return {}
        return guarded(lambda: finite_summaries(service.node_summaries(
            key["trial"], key["training_step"], key["iteration"], kind=key["kind"], rank=key["rank"],
            type_of_execution=key.get("step_type") if isinstance(key.get("step_type"), str) else None)),
            lambda _message: {})


def finite_summaries(summaries: dict[str, dict[str, float | None]]) -> dict[str, dict[str, float | None]]:
    """NaN and infinities as None: JSON has no words for them."""
    return {node: {name: value if value is None or math.isfinite(value) else None for name, value in stats.items()}
            for node, stats in summaries.items()}


# -- series plot, tabs, polling ------------------------------------------------------------------------
def _register_series(app: Dash, service: RecordingService) -> None:
    @app.callback(Output(ID.SERIES, "children"), Input(ID.SHOWN, "data"), Input(ID.STATISTIC, "value"),
                  Input(ID.DATA_VERSION, "data"), Input(ID.RANK, "value"), Input(ID.TABS, "active_tab"),
                  State(ID.PLOTS_LATER, "data"))
    def update_series(shown: dict[str, Any] | None, statistic: str, _version: str, rank: Any = None,
                      active: Any = None, later: Any = None) -> Any:
        drawn_later(ID.SERIES, active, later)
        if active not in (None, "tensors"):
            return plot_later()
        selection = selection_from(shown)
        if selection is None:
            return _graph(figures.empty_figure("Nothing selected."))
        statistic = statistic if statistic in PLOT_STATISTICS else "mean"
        title = series_title(selection, statistic)
        try:
            lines = series(service, selection, statistic or "mean", all_ranks=rank == ALL_RANKS)
        except ReadSuperseded:  # the user clicked on meanwhile: the newer click's plot comes instead
            raise PreventUpdate from None
        except Exception as error:  # noqa: BLE001 - shown in the plot's place, as guarded does
            return _graph(guarded(raiser(error), figures.empty_figure))
        return _graph(guarded(lambda: figures.series_figure(
            lines, title=title, current_trial=selection.trial, current_step=selection.training_step,
            trials=service.trials()),
            figures.empty_figure))

    @app.callback(Output(ID.STATISTIC, "value"), Input(ID.URL, "search"))
    def statistic_from_link(search: Any) -> Any:
        """A link with ``stat=`` (a finding's: "min" for a one-sided tensor) plots that statistic across steps."""
        wanted = parse_qs(search.lstrip("?")).get("stat", [None])[-1] if isinstance(search, str) else None
        return wanted if wanted in PLOT_STATISTICS else no_update

    @app.callback(Output(ID.DISTRIBUTION, "children"), Input(ID.SHOWN, "data"), Input(ID.DATA_VERSION, "data"),
                  Input(ID.DISTRIBUTION_MODE, "value"), Input(ID.DISTRIBUTION_SHOWN, "data"))
    def update_distribution(shown: dict[str, Any] | None, _version: str, mode: Any = None,
                            in_view: Any = True) -> Any:
        """TensorBoard's Distributions view (or its Histograms view): the tensor's stored values across steps,
        trials side by side; read and drawn only while the plot is in view (a node click does not wait for it)."""
        if not in_view:
            if ctx.triggered_id == ID.DISTRIBUTION_SHOWN:
                raise PreventUpdate  # scrolled out of view: what is drawn stays
            return distribution_later()
        selection = selection_from(shown)
        if selection is None:
            return _graph(figures.empty_figure("Nothing selected."))
        if mode == "histograms":
            title = f"Histograms of {tensor_name(selection)} across steps, {selection.kind}"
            return _graph(guarded(lambda: figures.histograms_figure(histograms(service, selection), title=title),
                                  figures.empty_figure))
        title = f"Distribution of {tensor_name(selection)} across steps, {selection.kind}"
        return _graph(guarded(lambda: figures.distribution_figure(
            distributions(service, selection), title=title, current_step=selection.training_step,
            trials=service.trials()),
            figures.empty_figure))

    app.clientside_callback(_PLOTS_LATER_JS % (json.dumps([ID.SERIES, ID.HISTOGRAM]), json.dumps(LATER_CLASS)),
                            Output(ID.PLOTS_LATER, "data"), Input(ID.SERIES, "children"),
                            Input(ID.HISTOGRAM, "children"))

    # A callback of its own, so that the values are shown before the plots are drawn.
    @app.callback(Output(ID.HISTOGRAM, "children"), Input(ID.SHOWN, "data"), Input(ID.TABS, "active_tab"),
                  State(ID.PLOTS_LATER, "data"))
    def update_histogram(shown: dict[str, Any] | None, active: Any = None, later: Any = None) -> Any:
        drawn_later(ID.HISTOGRAM, active, later)
        if active not in (None, "tensors"):
            return plot_later()
        selection = selection_from(shown)
        if selection is None:
            return _graph(figures.empty_figure("Nothing selected."))
        return _graph(guarded(lambda: neuron_figure(service, selection), figures.empty_figure))


# The plots of the Tensors tab are drawn only while it is shown: a graph in a hidden tab loads and parses plotly.js
# (4.8 MB, a 2-5 s task of the browser's main thread on a loaded machine), which held the Runs tab's first rows or the
# first filter typed in it when Runs was clicked before the first page had drawn. ``PLOTS_LATER`` lists the plots
# waiting (a clientside callback keeps it from what the page shows): those drawn later and those never drawn (a first
# answer still on its way when the tab changed is dropped by Dash for the newer request); coming back to the tab draws
# those only, and a plot already drawn stays as it is (its zoom too).
LATER_CLASS = "plot-later"
_PLOTS_LATER_JS = """
function(...shown) {
    const ids = %s, later = %s;
    return ids.filter((id, i) => {
        if (!shown[i]) { return true; }  // never drawn (its first answer dropped for a newer request): waiting
        const props = shown[i].props || {};
        return String(props.className || '').split(' ').includes(later);
    });
}
"""


def drawn_later(plot: str, active: Any, later: Any) -> None:
    """Raise PreventUpdate where a tab switch leaves ``plot`` as it is: leaving the Tensors tab, or coming back to
    it while ``plot`` is drawn already."""
    if set(ctx.triggered_prop_ids) != {f"{ID.TABS}.active_tab"}:  # something else changed too: answer it
        return
    if active not in (None, "tensors") or plot not in (later or []):
        raise PreventUpdate


def plot_later() -> Any:
    """In a plot's place while the Tensors tab is hidden: no graph, so plotly.js is not loaded for it."""
    return html.Div("Drawn when the Tensors tab is shown.", className=f"{LATER_CLASS} text-muted small")


def distribution_later() -> Any:
    """In the distribution plot's place while it is out of view: nothing is read for it until it comes into view."""
    return html.Div("The distribution across steps is drawn when it comes into view.",
                    className="distribution-later text-muted small")


def neuron_figure(service: RecordingService, selection: Selection) -> Any:
    """A 2-D tensor's stored values as a heatmap, a few as markers, many as a histogram (figures.neuron_figure)."""
    stored = service.neuron_values(selection)
    return figures.neuron_figure(stored.values, shape=stored.shape, total=stored.total,
                                 has_batch=parse_aggregation(selection.aggregation)[0] != "none",
                                 title=f"Neuron values of {tensor_name(selection)}")


def series_title(selection: Selection, statistic: str) -> str:
    """The series plot's title, in the words of the selectors (no "none", no "iteration -1")."""
    aggregation = parse_aggregation(selection.aggregation)[0]
    parts = [f"{statistic} of {tensor_name(selection)}", selection.kind]
    if aggregation != "none":
        parts.append(aggregation_label(selection.aggregation).lower())
    if selection.data_iteration >= 0:
        parts.append(f"iteration {selection.data_iteration}")
    return ", ".join(parts)


def _graph(figure: Any) -> Any:
    return dcc.Graph(figure=figure, config={"displaylogo": False})


def neurons(service: RecordingService, selection: Selection) -> list[float]:
    return service.neuron_values(selection).values  # the question lives in service; kept for older callers


def tensor_name(selection: Any) -> str:
    """``node [role]``, or the node alone where the role only repeats it (a parameter's role is its own name)."""
    return selection.node if selection.role in (selection.node, "", None) else f"{selection.node} [{selection.role}]"
