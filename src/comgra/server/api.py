"""The REST API: versioned JSON under ``/api/v1``, on the app's own Flask server, from the same service.

Its contract is the OpenAPI document in ``api_spec`` (served at ``/api/v1/openapi.json``), which
the tests check every route against. What arrives is data, never code: query values are parsed
as integers or matched against known names, and a breakpoint's condition goes to the whitelist
parser of ``comgra.breakpoints.conditions``. A bad value is a 4xx whose JSON names the field.

State-changing calls (POST, PATCH, DELETE) are refused from another web origin and need the token
the server prints at start, on loopback too (``Authorization: Bearer <token>``, or the cookie that the
printed link ``/?token=...`` sets); reads need it off loopback, or with ``--token-for-reads``.
``doors.check_state_change`` is that one check; the app's state-changing callbacks call it too, and take
their trial through ``trial_folder``, as the routes do.

    $ curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8055/api/v1/trials
    {"trials": ["trial_a"]}
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flask import Blueprint, Flask, Response, current_app, json, request
from werkzeug.exceptions import HTTPException

from comgra.errors import (BreakpointError, ComgraError, ConfigError, NotPaused, SelectionError, UnknownBreakpoint,
                           did_you_mean, disk_problem)
from comgra.server.api_spec import API_PREFIX, openapi_document
from comgra.server.doors import (READS_CONFIG, TOKEN_CONFIG, ApiError, accept_token_link, check_breakpoint_target,
                                 check_read, check_state_change, trial_folder)
from comgra.server.json_rows import object_json, rows_json
from comgra.service import RecordingService, aggregation_value, view_link
from comgra.service.kpi_points import MAX_POINTS, downsampled
from comgra.store import format as fmt, layout

INT_LIMIT = 2**62
_INTEGER = re.compile(r"-?[0-9]{1,19}")  # ASCII digits only: str.isdigit() also takes "²" and "٣"
PHASES = ("forward", "backward")
AGGREGATIONS = ("mean", "std", "abs_max", "none", "sample")
RUN_ACTIONS = ("continue", "step", "abort")
MAX_RUNS = 10_000  # rows of one /runs answer
FINDINGS_WAIT_S = 1.0  # a live trial's findings: the last result after at most this long (then "refreshing")


# -- reading what was sent --------------------------------------------------------------------------
def int_arg(name: str, *, default: int | None = None, required: bool = False, minimum: int | None = None) -> int | None:
    raw = request.args.get(name)
    if raw is None:
        if required:
            raise ApiError(400, f"The query parameter {name!r} is required (an integer).", name)
        return default
    text = raw.strip()
    if not _INTEGER.fullmatch(text) or abs(int(text)) >= INT_LIMIT:
        raise ApiError(400, f"{name}={raw[:40]!r} is not an integer.", name)
    value = int(text)
    if minimum is not None and value < minimum:
        raise ApiError(400, f"{name}={value} must be >= {minimum}.", name)
    return value


def str_arg(name: str, *, default: str | None = None, required: bool = False,
            choices: tuple[str, ...] | None = None) -> str | None:
    raw = request.args.get(name)
    if raw is None:
        if required:
            raise ApiError(400, f"The query parameter {name!r} is required.", name)
        return default
    if raw == "":
        raise ApiError(400, f"{name} is empty; leave it out for the default.", name)
    if len(raw) > 1000:
        raise ApiError(400, f"{name} is longer than 1000 characters.", name)
    if choices is not None and raw not in choices:
        raise ApiError(400, f"{name}={raw[:40]!r} is not one of {list(choices)}.", name)
    return raw


def json_body(allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, Any]:
    try:
        body = request.get_json(silent=True, force=True) if request.content_length else None
    except RecursionError:  # silent=True catches what the parser raises for bad JSON, not this
        raise ApiError(400, "The request body is nested too deeply to be a breakpoint.", "body") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"The request body must be a JSON object with {list(allowed)}.", "body")
    unknown = sorted(str(k) for k in body if k not in allowed)
    if unknown:
        raise ApiError(400, f"Unknown field(s) {unknown[:5]}; known: {list(allowed)}.", unknown[0][:100])
    missing = [k for k in required if k not in body]
    if missing:
        raise ApiError(400, f"The field {missing[0]!r} is required.", missing[0])
    return body


def plain(value: Any) -> Any:
    """JSON-safe data: NaN and infinities become null (JSON has no such numbers), numpy to Python."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:  # the bulk of a long answer: no more checks
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): plain(v) for k, v in value.items()}
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    return value


def answer(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(plain(data), separators=(",", ":")), status=status, mimetype="application/json")


def api_url(path: str, **query: Any) -> str:
    """A link to an API call (``api_url("trials/a/layers")``), for the app's "API" links."""
    from urllib.parse import quote, urlencode

    params = {k: v for k, v in query.items() if v is not None}
    return f"{API_PREFIX}/{quote(path)}" + (f"?{urlencode(params)}" if params else "")


# -- the blueprint -------------------------------------------------------------------------------------
def blueprint(service: RecordingService) -> Blueprint:
    api = Blueprint("comgra_api", __name__, url_prefix=API_PREFIX)
    api.before_request(_check_state_change)
    api.before_request(_check_query_names)
    api.register_error_handler(Exception, _error)
    routes = Routes(service)
    for rule, methods, view in routes.table():
        api.add_url_rule(rule, view.__name__, view, methods=methods)
    return api


def install(server: Flask, service: RecordingService) -> None:
    """Serve the API on ``server`` (the app's Flask server)."""
    server.config.setdefault(TOKEN_CONFIG, None)
    server.config.setdefault(READS_CONFIG, False)
    server.before_request(accept_token_link)
    server.before_request(check_read)
    server.register_blueprint(blueprint(service))


def _known_query_names() -> dict[tuple[str, str], set[str]]:
    """(route rule, METHOD) -> the query parameters its document lists."""
    names = {}
    for path, item in openapi_document()["paths"].items():
        rule = API_PREFIX + re.sub(r"\{(\w+)\}", r"<\1>", path)
        for method, operation in item.items():
            names[(rule, method.upper())] = {p["name"] for p in operation["parameters"] if p["in"] == "query"}
    for action in RUN_ACTIONS:  # one rule serves the three documented actions
        names[(f"{API_PREFIX}/trials/<trial>/run/<action>", "POST")] = set()
    return names


_QUERY_NAMES = _known_query_names()


def _check_query_names() -> None:
    """An unknown query parameter is a mistake (``stpe=3``), not something to ignore silently."""
    rule = request.url_rule.rule if request.url_rule is not None else None
    known = _QUERY_NAMES.get((rule, request.method)) if rule else None
    if known is None:
        return
    unknown = sorted(set(request.args) - known)
    if unknown:
        name = unknown[0][:100]
        raise ApiError(400, f"Unknown query parameter {name!r}" + did_you_mean(name, known), name)


def _check_state_change() -> None:
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        check_state_change()


def _error(error: Exception) -> Response:
    if isinstance(error, ApiError):
        return _error_answer(error.status, error.message, error.field, error.problems)
    if isinstance(error, OSError) and disk_problem(error):  # a full or read-only disk, not a fault of comgra's
        return _error_answer(507, f"comgra could not write: {disk_problem(error)}.", None)
    if isinstance(error, HTTPException):
        return _error_answer(error.code or 500, error.description or error.name, None)
    if isinstance(error, UnknownBreakpoint):
        return _error_answer(404, str(error), "id")
    if isinstance(error, BreakpointError):
        return _error_answer(400, str(error), error.field)
    if isinstance(error, NotPaused):
        return _error_answer(409, str(error), None)
    if isinstance(error, SelectionError):
        return _error_answer(404, str(error), None)
    if isinstance(error, ComgraError):
        return _error_answer(400, str(error), None)
    current_app.logger.error("comgra: an API request failed: %s %s", request.method, request.path, exc_info=error)
    return _error_answer(500, "comgra hit an internal error; the terminal that runs the app shows the details.", None)


def _error_answer(status: int, message: str, field: str | None, problems: list[str] | None = None) -> Response:
    """The error document; ``problems``: the damaged files that may explain it (a step left out with its chunk)."""
    return answer({"error": {"status": status, "message": message, "field": field},
                   **({"problems": problems} if problems else {})}, status)


class Routes:
    """The handlers; each reads its arguments, asks the service, and answers plain JSON."""

    def __init__(self, service: RecordingService):
        self.service = service

    def table(self) -> list[tuple[str, list[str], Callable[..., Response]]]:
        t = "/trials/<trial>"
        return [
            ("/", ["GET"], self.index), ("/openapi.json", ["GET"], self.openapi),
            ("/trials", ["GET"], self.trials), (f"{t}/steps", ["GET"], self.steps),
            (f"{t}/graph", ["GET"], self.graph), (f"{t}/values", ["GET"], self.values),
            (f"{t}/series", ["GET"], self.series), (f"{t}/kpis", ["GET"], self.kpis),
            (f"{t}/notes", ["GET"], self.notes), (f"{t}/modules", ["GET"], self.modules),
            (f"{t}/layers", ["GET"], self.layers), (f"{t}/layers/<module>", ["GET"], self.layer),
            (f"{t}/profile", ["GET"], self.profile), (f"{t}/flamegraph", ["GET"], self.flamegraph),
            (f"{t}/trace", ["GET"], self.trace), (f"{t}/resources", ["GET"], self.resources),
            ("/findings", ["GET"], self.findings), ("/runs", ["GET"], self.runs),
            (f"{t}/breakpoints", ["GET", "POST"], self.breakpoints),
            (f"{t}/breakpoints/<breakpoint_id>", ["PATCH", "DELETE"], self.breakpoint),
            (f"{t}/run", ["GET"], self.run), (f"{t}/run/<action>", ["POST"], self.run_command),
            ("/<path:rest>", ["GET", "POST", "PATCH", "DELETE", "PUT"], self.not_found),
        ]

    # -- helpers --------------------------------------------------------------------------------
    def _trial(self, trial: str) -> str:
        known = self.service.trials()
        if trial not in known:
            raise ApiError(404, f"No trial {trial[:100]!r} in this recording" + did_you_mean(trial[:100], known), "trial")
        return trial

    def _trial_dir(self, trial: str) -> Path:
        return trial_folder(self.service, self._trial(trial))

    def _rank(self, trial: str) -> int:
        ranks = self.service.ranks(trial)
        rank = int_arg("rank", default=ranks[0])
        if rank not in ranks:
            raise ApiError(404, f"rank={rank} did not record trial {trial!r}; ranks: {ranks}.", "rank")
        return rank  # type: ignore[return-value]

    def _step_rows(self, trial: str, rank: int) -> tuple[int, list[dict[str, Any]]]:
        step, execution = int_arg("step", required=True), str_arg("execution")  # a step is (number, type of execution)
        rows = self.service.step_index(trial, rank).rows_of(step, execution)  # type: ignore[arg-type]
        if not rows:  # or its rows are in a chunk left out as damaged: then say so
            problems = self._problems(trial)
            raise ApiError(404, f"Training step {step}{'' if execution is None else f' of type {execution[:100]!r}'} "
                           f"is not recorded in trial {trial!r} (rank {rank})"
                           + (f", or it was left out with a damaged file: {problems}." if problems else "."), "step",
                           problems)
        return step, rows  # type: ignore[return-value]

    def _iteration_row(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        iteration = int_arg("iteration", default=rows[0]["iteration"])
        row = next((r for r in rows if r["iteration"] == iteration), None)
        if row is None:
            raise ApiError(404, f"iteration={iteration} is not in this step; iterations: "
                                f"{[r['iteration'] for r in rows]}.", "iteration")
        return row

    def _answer(self, trial: str, data: dict[str, Any]) -> Response:
        """An answer built from ``trial``, with the files left out of it (``problems``), as the app's banner says.
        Asked after the data was read: damage is found by reading."""
        return answer({**data, "problems": self._problems(trial)})

    def _problems(self, trial: str) -> list[str]:
        try:
            reasons = self.service.trial(trial).problem_reasons()
        except ComgraError as error:
            return [str(error)]
        return [f"{layout.chunk_label(Path(p))}: {reason}" for p, reason in reasons.items()]

    def _steps_filter(self) -> dict[str, Any]:  # execution: the steps' type_of_execution (none: every type)
        return {"first_step": int_arg("first_step"), "last_step": int_arg("last_step"), "execution": str_arg("execution")}

    # -- routes ---------------------------------------------------------------------------------
    def index(self) -> Response:
        return answer({"version": "v1", "openapi": f"{API_PREFIX}/openapi.json"})

    def openapi(self) -> Response:
        return answer(openapi_document())

    def not_found(self, rest: str) -> Response:
        raise ApiError(404, f"No API route {('/' + rest)[:100]!r}; see {API_PREFIX}/openapi.json.", None)

    def trials(self) -> Response:
        return answer({"trials": self.service.trials()})

    def steps(self, trial: str) -> Response:
        rank, offset = self._rank(self._trial(trial)), int_arg("offset", default=0, minimum=0)  # rows only append:
        table = self.service.step_index(trial, rank).table  # a page stays put; the JSON is built by slices
        rows = rows_json(table.slice(offset, int_arg("limit", minimum=1)), plain=plain)
        return Response(object_json({"trial": trial, "rank": rank, "steps": rows, "total": table.num_rows, "offset": offset,
                                     "problems": self._problems(trial)}, plain=plain), mimetype="application/json")

    def graph(self, trial: str) -> Response:
        rank = self._rank(self._trial(trial))
        step, rows = self._step_rows(trial, rank)
        row = self._iteration_row(rows)
        try:
            graph = self.service.trial(trial).graph(row["graph"])
        except ComgraError as error:  # a damaged or missing graph document: a 404 that names it
            raise ApiError(404, str(error), "step", self._problems(trial) + [str(error)]) from None
        return self._answer(trial, {"trial": trial, "training_step": step, "type_of_execution": row["type_of_execution"],
                                    "iteration": row["iteration"], "rank": rank, "graph": graph})

    def values(self, trial: str) -> Response:
        self._trial(trial)
        rank = self._rank(trial)
        step, rows = self._step_rows(trial, rank)
        iteration = self._iteration_row(rows)["iteration"]
        graph = self.service.trial(trial).graph(self._iteration_row(rows)["graph"])
        node = str_arg("node")
        node_ids = sorted(n["id"] for n in graph["nodes"])
        if node is not None and node not in node_ids:
            raise ApiError(404, f"node={node[:100]!r} is not in the graph of step {step}, iteration {iteration}"
                           + did_you_mean(node[:100], node_ids), "node")
        aggregation = str_arg("aggregation", choices=AGGREGATIONS)
        sample = int_arg("sample", default=0 if aggregation == "sample" else -1, minimum=-1)
        wanted: dict[str, Any] = {"trial": trial, "training_step": step, "iteration": iteration, "rank": rank,
                                  "node_id": node, "kind": str_arg("kind"), "step_type": rows[0]["type_of_execution"],
                                  "aggregation": None if aggregation is None else aggregation_value(aggregation, sample or 0)}
        view = self.service.resolve({k: v for k, v in wanted.items() if v is not None})
        selection = view.selection
        if selection is None:
            raise ApiError(404, " ".join(view.banners + view.notices) or "Nothing to show.", None,
                           self._problems(trial))
        role = str_arg("role")
        if role is not None and role != selection.role:
            view = self.service.resolve({**wanted, "node_id": selection.node_id, "roles": {selection.node: role}})
            selection = view.selection
        self._check_met(selection, role=role, kind=wanted["kind"], aggregation=wanted["aggregation"])
        link = view_link(trial, type_of_execution=str_arg("execution"), training_step=step, iteration=iteration,
                         node_id=selection.node_id,  # type: ignore[union-attr]
                         role=selection.role, kind=selection.kind, aggregation=selection.aggregation, rank=rank)  # type: ignore[union-attr]
        return self._answer(trial, {"selection": selection.to_dict(), "values": view.row, "app_link": link})  # type: ignore[union-attr]

    @staticmethod
    def _check_met(selection: Any, **asked: str | None) -> None:
        for name, value in asked.items():
            if value is not None and getattr(selection, name) != value:
                raise ApiError(404, f"{name}={value[:100]!r} was not recorded for this node at this step.", name)

    def series(self, trial: str) -> Response:
        self._trial(trial)
        aggregation = str_arg("aggregation", default="mean", choices=AGGREGATIONS)
        statistic = str_arg("statistic", default="mean", choices=fmt.STATISTICS + ("svd_max",))
        sample = int_arg("sample", default=0 if aggregation == "sample" else -1, minimum=-1)
        table = self.service.trial(trial).series(
            node=str_arg("node", required=True), role=str_arg("role", required=True),  # type: ignore[arg-type]
            kind=str_arg("kind", default=fmt.FORWARD), iteration=int_arg("iteration", default=0),  # type: ignore[arg-type]
            aggregation=aggregation, sample=sample, statistic=statistic, rank=self._rank(trial),  # type: ignore[arg-type]
            type_of_execution=str_arg("execution"))
        return self._answer(trial, {"trial": trial, "statistic": statistic,
                                    "training_step": table["training_step"].to_pylist(), "value": table["value"].to_pylist()})

    def kpis(self, trial: str) -> Response:
        table, cut = downsampled(self.service.kpis(self._trial(trial)), int_arg("max_points", default=MAX_POINTS,
                                                                                 minimum=0))  # type: ignore[arg-type]
        columns = {name: table[name].to_pylist() for name in table.column_names}  # by column: 10x faster than rows
        rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
        return self._answer(trial, {"trial": trial, "kpis": rows, "downsampled": cut})

    def notes(self, trial: str) -> Response:
        return self._answer(trial, {"trial": trial, "notes": self.service.notes(self._trial(trial))})

    def modules(self, trial: str) -> Response:
        return self._answer(trial, {"trial": trial, "modules": self.service.modules(self._trial(trial))})

    def layers(self, trial: str) -> Response:
        return self._answer(trial, {"trial": trial, "layers": self.service.layers(self._trial(trial))})

    def layer(self, trial: str, module: str) -> Response:
        self._trial(trial)
        limit = int_arg("limit", default=100, minimum=1)
        try:
            rows = self.service.layer_history(trial, module, limit=limit)  # type: ignore[arg-type]
        except SelectionError as error:
            problems = self._problems(trial)  # a module's rows may be in a chunk that was left out
            raise ApiError(404, str(error) + (f" Left out as damaged: {problems}." if problems else ""),
                           "module") from None
        return self._answer(trial, {"trial": trial, "module": module, "executions": rows})

    def profile(self, trial: str) -> Response:
        self._trial(trial)
        phase = str_arg("phase", default="forward", choices=PHASES)
        limit = int_arg("limit", minimum=1)
        return self._answer(trial, {"trial": trial, "phase": phase, "layers": self.service.profile_summary(
            trial, phase, limit=limit, **self._steps_filter())})  # type: ignore[arg-type]

    def flamegraph(self, trial: str) -> Response:
        self._trial(trial)
        phase = str_arg("phase", default="forward", choices=PHASES)
        return self._answer(trial, {"trial": trial, "phase": phase,
                                    "nodes": self.service.flame_graph(trial, phase, **self._steps_filter())})  # type: ignore[arg-type]

    def trace(self, trial: str) -> Response:
        self._trial(trial)
        response = self._answer(trial, self.service.chrome_trace(trial, **self._steps_filter()))  # viewers ignore the key
        if str_arg("download", default="false", choices=("true", "false", "1", "0")) in ("true", "1"):
            response.headers["Content-Disposition"] = f'attachment; filename="comgra-trace-{_file_safe(trial)}.json"'
        return response

    def resources(self, trial: str) -> Response:
        return self._answer(trial, {"trial": trial, **self.service.resources(self._trial(trial))})

    def findings(self) -> Response:
        trial = str_arg("trial")
        trials = [self._trial(trial)] if trial is not None else self.service.trials()
        find = getattr(self.service, "findings", None)
        if find is None:
            return answer({"available": False, "findings": [],
                           "message": "This comgra has no findings analysis."})
        entries = []
        for t in trials:
            progress, refreshing = self._findings_of(t)
            scan_problems = progress.problems  # unreadable chunks and graphs, failed detectors
            entries.append({"trial": t, "findings": progress.findings, "refreshing": refreshing,
                            "problems": list(dict.fromkeys(
                                [*self._problems(t), *(p.removeprefix("skipped ") for p in scan_problems)]))})
        return answer({"available": True, "findings": entries})

    def runs(self) -> Response:
        query = {"filter": str_arg("filter"), "sort": str_arg("sort"),
                 "offset": int_arg("offset", default=0, minimum=0), "limit": int_arg("limit", default=100, minimum=1)}
        if query["limit"] > MAX_RUNS:  # type: ignore[operator]
            raise ApiError(400, f"limit={query['limit']} is above {MAX_RUNS}; page with offset.", "limit")
        try:
            page = self.service.runs(**query)  # type: ignore[arg-type]
        except ConfigError as error:
            raise ApiError(400, str(error), "filter" if str(error).startswith("filter") else "sort") from None
        return answer({"runs": [run.as_json() for run in page.runs], "total": page.total})
    def _findings_of(self, trial: str) -> tuple[Any, bool]:
        """(the findings so far, whether a newer scan runs). A live trial's last result at once, marked ``refreshing``
        (waiting on its scan took up to 2.7 s at load 28), its first after at most ``FINDINGS_WAIT_S``; others: scanned."""
        from comgra.breakpoints import control

        live = control.run_state(fmt.trial_dir(self.service.group.path, trial))["state"] in ("running", "paused")
        if live and self.service.findings_version(trial) > 0:  # a result to show: it is not held up by the scan
            progress = self.service.findings_progress(trial)
            return progress, trial in progress.pending
        progress = self.service.findings_progress(trial, FINDINGS_WAIT_S)
        if trial not in progress.pending or live:
            return progress, trial in progress.pending
        self.service.findings(trial)  # waits for the scan, as before
        return self.service.findings_progress(trial), False

    def breakpoints(self, trial: str) -> Response:
        from comgra.breakpoints import control

        directory = self._trial_dir(trial)
        if request.method == "GET":
            return answer({"trial": trial, "breakpoints": control.list_breakpoints(directory)})
        body = json_body(("target", "condition", "enabled"), required=("target", "condition"))
        check_breakpoint_target(self.service, trial, body["target"])
        created = control.add_breakpoint(directory, body["target"], body["condition"], body.get("enabled", True))
        return answer(created, 201)

    def breakpoint(self, trial: str, breakpoint_id: str) -> Response:
        from comgra.breakpoints import control

        directory = self._trial_dir(trial)
        if request.method == "DELETE":
            control.remove_breakpoint(directory, breakpoint_id)
            return answer({"deleted": breakpoint_id})
        body = json_body(("target", "condition", "enabled"))
        if any(body.get(k) is None and k in body for k in body):
            field = next(k for k in body if body[k] is None)
            raise ApiError(400, f"{field} must not be null.", field)
        if "target" in body:
            check_breakpoint_target(self.service, trial, body["target"])
        return answer(control.update_breakpoint(directory, breakpoint_id, **body))

    def run(self, trial: str) -> Response:
        from comgra.breakpoints import control

        return answer({"trial": trial, "problems": [], **control.run_state(self._trial_dir(trial))})

    def run_command(self, trial: str, action: str) -> Response:
        from comgra.breakpoints import control

        directory = self._trial_dir(trial)
        if action not in RUN_ACTIONS:
            raise ApiError(404, f"No run command {action[:40]!r}; use one of {list(RUN_ACTIONS)}.", "action")
        control.send_command(directory, action)
        return answer({"trial": trial, "sent": action, "problems": [], **control.run_state(directory)})


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
