"""The Samples tab: one row per recorded sample of the shown step and iteration, one column per chosen tensor.

Columns are a statistic (or one stored value, a "neuron") of a tensor per sample,
so that samples can be compared side by side and sorted: the tutorial's
``loss_per_sample`` against ``helper_partial_sums`` is one look. The step and
iteration are those shown in the Tensors tab (the ``shown`` store); the data
question is :meth:`comgra.service.RecordingService.samples_table`.
"""
from __future__ import annotations

import json
import math
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update
from dash.dash_table.DataTable import DataTable
from dash.development.base_component import Component

from comgra.errors import ComgraError
from comgra.server.dom import attributes
from comgra.service import NEURON, PLOT_STATISTICS, RecordingService, SampleColumn, SamplesTable, Selection

MAX_COLUMNS = 24  # a table wider than this is no longer read side by side


class ID:
    COLUMNS = "samples-columns"
    STATISTIC = "samples-statistic"
    NEURON = "samples-neuron"
    ADD_SELECTED = "samples-add-selected"
    CAPTION = "samples-caption"
    TABLE = "samples-table"
    SHOWN = "samples-shown"  # dcc.Store: the Tensors tab's selection, copied in the page while this tab is open
    CSV = "samples-csv"  # the table as shown (sorted as shown), full precision: comgra-samples-<trial>-step<N>.csv
    DOWNLOAD = "samples-download"


def panel() -> html.Div:
    """The tab's skeleton; callbacks fill the choices and the table."""
    statistics = [{"label": s, "value": s} for s in PLOT_STATISTICS] + [{"label": "one neuron", "value": NEURON}]
    return html.Div(className="samples-panel", children=[
        dcc.Store(id=ID.SHOWN, storage_type="memory"),
        html.Div(className="d-flex flex-wrap align-items-end gap-3 mb-2", children=[
            html.Div(className="selector samples-statistic", children=[
                html.Label("Value per sample", htmlFor=ID.STATISTIC, className="form-label"),
                dcc.Dropdown(id=ID.STATISTIC, options=statistics, value="mean", clearable=False)]),
            html.Div(className="selector samples-neuron", children=[
                html.Label("Neuron", htmlFor=ID.NEURON, className="form-label"),
                dcc.Input(id=ID.NEURON, type="number", min=0, step=1, value=0, debounce=True,
                          className="form-control form-control-sm")]),
            html.Button("Add the selected node", id=ID.ADD_SELECTED, className="btn btn-outline-primary btn-sm",
                        title="Add the tensor selected in the Tensors tab as a column"),
            html.Button("Download CSV", id=ID.CSV, n_clicks=0, className="btn btn-outline-secondary btn-sm",
                        title="The table as shown (its sort too), the numbers at full precision"),
            dcc.Download(id=ID.DOWNLOAD),
        ]),
        html.Div(className="selector samples-columns-selector", children=[
            html.Label("Columns (tensors of this iteration with per-sample values)", htmlFor=ID.COLUMNS,
                       className="form-label"),
            dcc.Dropdown(id=ID.COLUMNS, multi=True, value=[], placeholder="Choose tensors…")]),
        html.P(id=ID.CAPTION, className="text-muted small mt-2", role="status"),
        DataTable(id=ID.TABLE, sort_action="native", sort_mode="multi", page_action="none",
                             style_table={"overflowX": "auto", "maxHeight": "70vh", "overflowY": "auto"},
                             fixed_rows={"headers": True}, style_cell={"fontFamily": "monospace", "minWidth": "90px"},
                             style_header={"fontWeight": "bold", "whiteSpace": "normal", "height": "auto"}),
    ])


def register(app: Dash, service: RecordingService, *, shown_store: str, tabs: str) -> None:
    """Callbacks of the tab. ``shown_store`` holds the Tensors tab's selection, ``tabs`` the active tab."""
    app.clientside_callback(copy_while_open("samples"), Output(ID.SHOWN, "data"), Input(tabs, "active_tab"),
                            Input(shown_store, "data"))
    register_download(app)

    @app.callback(Output(ID.COLUMNS, "options"), Input(tabs, "active_tab"), Input(ID.SHOWN, "data"),
                  Input(ID.STATISTIC, "value"), Input(ID.NEURON, "value"), State(ID.COLUMNS, "value"))
    def update_choices(active: str, shown: Any, statistic: str, neuron: Any, chosen: Any) -> Any:
        if active != "samples":
            return no_update
        selection = _selection(shown)
        choices: list[SampleColumn] = []
        if selection is not None:
            try:
                choices = service.sample_columns(selection.trial, selection.training_step, selection.iteration,
                                                 rank=selection.rank, type_of_execution=selection.step_type)
            except ComgraError:
                choices = []
        return column_options(choices, statistic, _neuron(neuron), _keys(chosen))

    @app.callback(Output(ID.COLUMNS, "value"), Input(ID.ADD_SELECTED, "n_clicks"), State(shown_store, "data"),
                  State(ID.STATISTIC, "value"), State(ID.NEURON, "value"), State(ID.COLUMNS, "value"),
                  prevent_initial_call=True)
    def add_selected(_clicks: Any, shown: Any, statistic: str, neuron: Any, chosen: Any) -> Any:
        selection = _selection(shown)
        if selection is None:
            return no_update
        column = SampleColumn(selection.node_id, selection.role, selection.kind)
        column = column.with_statistic(statistic if statistic in (*PLOT_STATISTICS, NEURON) else "mean", _neuron(neuron))
        keys = _keys(chosen)
        return keys if column.key in keys else [*keys, column.key][-MAX_COLUMNS:]

    @app.callback(Output(ID.TABLE, "columns"), Output(ID.TABLE, "data"), Output(ID.CAPTION, "children"),
                  Input(tabs, "active_tab"), Input(ID.SHOWN, "data"), Input(ID.COLUMNS, "value"))
    def update_table(active: str, shown: Any, chosen: Any) -> Any:
        if active != "samples":
            return no_update, no_update, no_update
        selection = _selection(shown)
        if selection is None:
            return [], [], "Select a tensor in the Tensors tab first: the table shows its step and iteration."
        columns = [c for c in (SampleColumn.parse(k) for k in _keys(chosen)) if c is not None][:MAX_COLUMNS]
        try:
            table = service.samples_table(selection.trial, selection.training_step, selection.iteration, columns,
                                          rank=selection.rank, type_of_execution=selection.step_type)
        except ComgraError as error:
            return [], [], str(error)
        return table_columns(table), table_rows(table), caption(table, selection)


def register_download(app: Dash) -> None:
    @app.callback(Output(ID.DOWNLOAD, "data"), Input(ID.CSV, "n_clicks"), State(ID.TABLE, "derived_virtual_data"),
                  State(ID.TABLE, "data"), State(ID.TABLE, "columns"), State(ID.CAPTION, "children"),
                  prevent_initial_call=True)
    def download(clicks: Any, shown_rows: Any, rows: Any, columns: Any, caption_: Any) -> Any:
        if not clicks or not isinstance(columns, list) or not columns:
            return no_update
        chosen = shown_rows if isinstance(shown_rows, list) and shown_rows else rows if isinstance(rows, list) else []
        return dcc.send_string(table_csv(columns, chosen), csv_name(caption_))


def table_csv(columns: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """The table as CSV: the headers the user sees, the values at full precision (repr), in the rows' order."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([str(c.get("name", c.get("id"))) for c in columns])
    for row in rows:
        writer.writerow([repr(v) if isinstance(v, float) else "" if v is None else v
                         for v in (row.get(str(c.get("id"))) for c in columns)])
    return out.getvalue()


def csv_name(caption_: Any) -> str:
    """comgra-samples-<trial>-step<N>-iteration<I>.csv, from the caption's data (what the table shows)."""
    props = caption_.get("props", {}) if isinstance(caption_, dict) else {}
    text = props.get("children")
    trial = text[0].split(",", 1)[0].removeprefix("Trial ") if isinstance(text, list) and text and \
        isinstance(text[0], str) else ""
    step, iteration = props.get("data-step"), props.get("data-iteration")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in trial)[:80]
    parts = ["comgra-samples", *([safe] if safe else []), *([f"step{step}"] if step else []),
             *([f"iteration{iteration}"] if iteration else [])]
    return "-".join(parts) + ".csv"


def copy_while_open(tab: str) -> str:
    """A clientside function (active tab, shown selection) -> the selection while ``tab`` is open, else no
    update: a hidden tab's callbacks then send no request on a click in the Tensors tab (each one held
    one of the browser's six connections to the app while the click's values were asked for)."""
    return ("function(active, shown) { return active === " + json.dumps(tab)
            + " ? shown : window.dash_clientside.no_update; }")


def column_options(choices: list[SampleColumn], statistic: str, neuron: int, chosen: list[str]) -> list[dict[str, str]]:
    """The dropdown's options: every tensor with samples under the chosen statistic, plus the columns chosen."""
    statistic = statistic if statistic in (*PLOT_STATISTICS, NEURON) else "mean"
    offered = [c.with_statistic(statistic, neuron) for c in choices]
    keys = {c.key for c in offered}
    kept = [c for c in (SampleColumn.parse(k) for k in chosen) if c is not None and c.key not in keys]
    return [{"label": c.label, "value": c.key} for c in (*kept, *offered)]


def table_columns(table: SamplesTable) -> list[dict[str, Any]]:
    """The sample, its category and type of step where any row has one (an empty column only takes room), the values."""
    numeric = {"type": "numeric", "format": {"specifier": ".6g"}}
    described = [{"name": name, "id": key} for name, key in (("category", "category"), ("type of step", "type_of_execution"))
                 if any(row.get(key) not in (None, "") for row in table.rows)]
    return [{"name": "sample", "id": "sample", "type": "numeric"}, *described,
            *[{"name": c.label, "id": c.key, **numeric} for c in table.columns]]


def table_rows(table: SamplesTable) -> list[dict[str, Any]]:
    """The rows as JSON can carry them: NaN and infinities become text (a JSON number cannot be NaN)."""
    return [{key: _cell(value) for key, value in row.items()} for row in table.rows]


def caption(table: SamplesTable, selection: Selection) -> Component:
    parts = [f"Trial {table.trial}, training step {table.training_step} ({table.type_of_execution}), "
             f"iteration {table.iteration}: {len(table.rows)} recorded samples."]
    if not table.columns:
        parts.append(" Choose tensors above, or select one in the Tensors tab and add it.")
    if table.missing:
        parts.append(f" No per-sample values here for: {', '.join(table.missing)}.")
    return html.Span(parts, **attributes({"data-step": str(selection.training_step),
                                          "data-iteration": str(selection.iteration)}))


def _cell(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _selection(shown: Any) -> Selection | None:
    from comgra.server.view_state import selection_from  # the one check of what the browser says it shows

    return selection_from(shown)


def _keys(chosen: Any) -> list[str]:
    return [k for k in chosen if isinstance(k, str)] if isinstance(chosen, list) else []


def _neuron(value: Any) -> int:
    return value if type(value) is int and 0 <= value < 2**31 else 0  # noqa: E721 - no bools
