"""The OpenAPI 3 document of the REST API, written as data beside the routes (``api.py``).

The tests validate it (openapi-spec-validator) and call every route it lists with valid and
malformed input (schemathesis), checking each answer against the schemas here.
"""
from __future__ import annotations

import copy
from typing import Any

from comgra._version import __version__

API_PREFIX = "/api/v1"

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["status", "message", "field"],
    "properties": {"status": {"type": "integer"}, "message": {"type": "string"},
                   "field": {"type": ["string", "null"]}}},
    "problems": {"type": "array", "items": {"type": "string"}}}}
_ANY_OBJECT = {"type": "object"}
_ROWS = {"type": "array", "items": {"type": "object"}}
_NUMBERS = {"type": "array", "items": {"type": ["number", "null"]}}
_BREAKPOINT = {"type": "object", "required": ["id", "target", "condition", "enabled", "hits"], "properties": {
    "id": {"type": "string"}, "target": {"type": "string"}, "condition": {"type": "string"},
    "enabled": {"type": "boolean"}, "hits": {"type": "integer"}}}
_RUN = {"type": "object", "required": ["state", "training_step", "breakpoint", "problems"], "properties": {
    "state": {"enum": ["running", "paused", "finished", "unknown"]},
    "training_step": {"type": ["integer", "null"]}, "breakpoint": {},
    "problems": {"type": "array", "items": {"type": "string"}}}}


def _object(required: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": required}


# What was left out of an answer built from a trial: files skipped as damaged, foreign or outside the trial,
# each "<folder>/<file>: <what is wrong>". Empty when the answer holds everything recorded.
_PROBLEMS = {"type": "array", "items": {"type": "string"},
             "description": "Files of the trial that were left out (damaged, foreign, outside it), with the reason."}


def _from_trial(required: dict[str, Any]) -> dict[str, Any]:
    """An answer built from a trial's files: it lists what it had to leave out (``problems``)."""
    return _object({**required, "problems": _PROBLEMS})


def _query(name: str, schema: dict[str, Any], description: str, required: bool = False) -> dict[str, Any]:
    if schema.get("type") == "string":  # an empty value is refused (api.str_arg): leave a parameter out instead
        schema = {**schema, "minLength": 1, "maxLength": 1000}
    return {"name": name, "in": "query", "required": required, "schema": schema, "description": description}


def _path(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}, "description": description}


_TRIAL = _path("trial", "A trial id, as listed by /trials.")
_INT = {"type": "integer", "minimum": -(2**62) + 1, "maximum": 2**62 - 1}  # what api.int_arg accepts
_STEP_RANGE = [_query("first_step", _INT, "Only training steps >= this."),
               _query("last_step", _INT, "Only training steps <= this."),
               _query("execution", {"type": "string"}, "Only steps of this type_of_execution (training, evaluation, "
                      "...; an evaluation may share a training step's number). Default: every type.")]
_RANK = _query("rank", _INT, "A torch.distributed rank (default: the lowest that recorded).")
_EXECUTION = _query("execution", {"type": "string"}, "A type of execution (training, evaluation, ...): an evaluation may "
                    "share a training step's number. Default: the type most steps have, where several share it.")
_PHASE = _query("phase", {"enum": ["forward", "backward"]}, "Which time to use (default forward).")
_AGGREGATION = {"enum": ["mean", "std", "abs_max", "none", "sample"]}


def _operation(summary: str, ok: dict[str, Any], *, parameters: list[dict[str, Any]] = (),  # type: ignore[assignment]
               errors: tuple[int, ...] = (400, 404), status: int = 200, body: dict[str, Any] | None = None,
               changes: bool = False) -> dict[str, Any]:
    responses = {str(status): {"description": "OK", "content": {"application/json": {"schema": ok}}}}
    for code in (*errors, *((401, 403, 507) if changes else ())):
        responses[str(code)] = {"description": _ERROR_TEXT[code], "content": {"application/json": {"schema": _ERROR}}}
    operation: dict[str, Any] = {"summary": summary, "parameters": list(parameters), "responses": responses}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if changes:
        operation["security"] = [{}, {"token": []}]
    return operation


_ERROR_TEXT = {400: "A query value or body field is invalid; error.field names it.",
               401: "The token that comgra printed at start is missing or wrong.",
               403: "A state-changing call from another web origin.",
               404: "The trial, step, node, module or breakpoint does not exist; error.field names which.",
               409: "The run is not paused.", 413: "The request body is too large.",
               507: "The disk is full or read-only: nothing was written."}


_NUMBER_OR_NULL = {"type": ["number", "null"]}
_RUN_ROW = _object({
    "trial": {"type": "string"},
    "hyperparameters": {"type": "object", "additionalProperties": {"type": ["number", "string", "boolean", "null"]},
                        "description": "record_hyperparameters, flattened with dots."},
    "kpis": {"type": "object", "description": "'group/name' -> last, best, min and max (null: no finite point).",
             "additionalProperties": _object({k: _NUMBER_OR_NULL for k in ("last", "best", "min", "max")})},
    "findings": _object({k: {"type": "integer", "minimum": 0} for k in ("error", "warning", "info")}),
    "status": {"enum": ["running", "finished", "crashed"]},
    "steps": {"type": "integer", "minimum": 0, "description": "The highest training step reached, plus one."},
    "duration": {**_NUMBER_OR_NULL, "description": "Seconds; null for a crashed trial."}})
_RUNS = _object({"runs": {"type": "array", "items": _RUN_ROW},
                 "total": {"type": "integer", "minimum": 0, "description": "Rows that pass the filter."}})
SORT_PATTERN = (r"^[-+]?(trial|status|steps|duration|hyperparameters\..+|kpis\..+\.(last|best|min|max)"
                r"|findings\.(error|warning|info))$")
_OFFSET = _query("offset", {"type": "integer", "minimum": 0, "maximum": 2**62 - 1}, "Skip this many rows (default 0).")
_RUNS_QUERY = [
    _query("filter", {"type": "string"}, "A regular expression searched in each trial id, hyperparameter value and "
                                         "'name=value' (e.g. 'lr=0\\.01', '^sweep_a'); a bad one is a 400."),
    _query("sort", {"type": "string", "pattern": SORT_PATTERN}, "trial, status, steps, duration, hyperparameters.<name>, "
                                       "kpis.<group/name>.<last|best|min|max> or findings.<severity>; "
                                       "a leading '-' sorts descending. Rows without the value come last."),
    _OFFSET,
    _query("limit", {"type": "integer", "minimum": 1, "maximum": 10000}, "At most this many rows (default 100)."),
]


def _paths() -> dict[str, Any]:
    t = "/trials/{trial}"
    trial_only = [_TRIAL]
    return {
        "/trials": {"get": _operation("The trials of the recording.", _object({"trials": {
            "type": "array", "items": {"type": "string"}}}), errors=())},
        f"{t}/steps": {"get": _operation(
            "The recorded training steps (one row per step and iteration), all or a page: rows only append, so "
            "offset + len(steps) < total says there are more.",
            _from_trial({"trial": {"type": "string"}, "steps": _ROWS, "offset": _INT,
                         "total": {"type": "integer", "minimum": 0, "description": "Rows of the whole index."}}),
            parameters=[_TRIAL, _RANK, _OFFSET,
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": 2**62 - 1},
                               "At most this many rows (default: every row from offset).")], errors=(400, 404))},
        f"{t}/graph": {"get": _operation("The dependency graph of one step and iteration.",
                                         _from_trial({"graph": _ANY_OBJECT, "training_step": _INT, "iteration": _INT,
                                                      "type_of_execution": {"type": "string"}}),
                                         parameters=[_TRIAL, _query("step", _INT, "A recorded training step.", True),
                                                     _query("iteration", _INT, "Default: the first."), _RANK,
                                                     _EXECUTION])},
        f"{t}/values": {"get": _operation(
            "What the values panel shows for one tensor: its statistics and its first values.",
            _from_trial({"selection": _ANY_OBJECT, "values": _ANY_OBJECT, "app_link": {"type": "string"}}),
            parameters=[_TRIAL, _query("step", _INT, "A recorded training step.", True),
                        _query("iteration", _INT, "Default: the first."),
                        _query("node", {"type": "string"}, "A node id of the graph (default: the first)."),
                        _query("role", {"type": "string"}, "A role of the node."),
                        _query("kind", {"type": "string"}, "forward, or a gradient group."),
                        _query("aggregation", _AGGREGATION, "Over the batch, or one sample."),
                        _query("sample", {**_INT, "minimum": -1}, "The sample for aggregation=sample."), _RANK,
                        _EXECUTION])},
        f"{t}/series": {"get": _operation(
            "One statistic of one tensor across every recorded step.",
            _from_trial({"training_step": {"type": "array", "items": _INT}, "value": _NUMBERS}),
            parameters=[_TRIAL, _query("node", {"type": "string"}, "The node's name.", True),
                        _query("role", {"type": "string"}, "Its role.", True),
                        _query("kind", {"type": "string"}, "Default forward."),
                        _query("iteration", _INT, "Default 0."), _query("aggregation", _AGGREGATION, "Default mean."),
                        _query("sample", {**_INT, "minimum": -1}, "For aggregation=sample."),
                        _query("statistic", {"enum": ["mean", "abs_mean", "std", "min", "max", "abs_max",
                                                      "nan_count", "inf_count", "svd_max"]}, "Default mean."),
                        _RANK, _EXECUTION])},
        f"{t}/kpis": {"get": _operation(
            "The KPIs (record_kpi_in_graph); a curve of more than max_points points keeps each bucket's min and max.",
            _from_trial({"kpis": _ROWS, "downsampled": {"type": "boolean", "description": "A curve was cut."}}),
            parameters=[_TRIAL, _query("max_points", {"type": "integer", "minimum": 0, "maximum": 2**62 - 1},
                                       "Points per curve at most (default 2000); 0: every point (export).")])},
        f"{t}/notes": {"get": _operation("The notes (add_note).", _from_trial({"notes": {
            "type": "array", "items": {"type": "string"}}}), parameters=trial_only)},
        f"{t}/modules": {"get": _operation("The tracked module trees.", _from_trial({"modules": _ROWS}),
                                           parameters=trial_only)},
        f"{t}/layers": {"get": _operation("The profiled modules (track_module(..., profile=True)).",
                                          _from_trial({"layers": _ROWS}), parameters=trial_only)},
        f"{t}/layers/{{module}}": {"get": _operation(
            "The last executions of one profiled module: times, memory, FLOPs, statistics.",
            _from_trial({"module": {"type": "string"}, "executions": _ROWS}),
            parameters=[_TRIAL, _path("module", "A dotted module name, e.g. net.b1.attn."),
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": 2**62 - 1}, "How many (default 100).")])},
        f"{t}/profile": {"get": _operation(
            "The slowest layers: total, calls, mean, min and max time in seconds.",
            _from_trial({"phase": {"type": "string"}, "layers": {"type": "array", "items": _object({
                "module": {"type": "string"}, "calls": _INT, "total": {"type": "number"},
                "mean": {"type": "number"}, "min": {"type": "number"}, "max": {"type": "number"}})}}),
            parameters=[_TRIAL, _PHASE, _query("limit", {"type": "integer", "minimum": 1, "maximum": 2**62 - 1}, "At most this many."),
                        *_STEP_RANGE])},
        f"{t}/flamegraph": {"get": _operation(
            "Nested time by module hierarchy: a node's value contains its children's.",
            _from_trial({"nodes": {"type": "array", "items": _object({
                "name": {"type": "string"}, "parent": {"type": "string"}, "value": {"type": "number"},
                "self_value": {"type": "number"}})}}),
            parameters=[_TRIAL, _PHASE, *_STEP_RANGE])},
        f"{t}/trace": {"get": _operation(
            "The executions as a Chrome trace (opens in Perfetto and chrome://tracing).",
            _from_trial({"traceEvents": _ROWS}),
            parameters=[_TRIAL, *_STEP_RANGE, _query("download", {"enum": ["true", "false", "1", "0"]}, "true: as a file to save.")])},
        f"{t}/resources": {"get": _operation(
            "CPU, memory and GPU samples over time; gpu says 'no GPU: ...' where there is none.",
            _from_trial({"gpu": {"type": "string"}, "status": _ROWS, "series": _ROWS}), parameters=trial_only)},
        "/runs": {"get": _operation("One row per trial (a sweep's runs table): hyperparameters, KPIs, findings, "
                                    "status, steps.", _RUNS, parameters=_RUNS_QUERY, errors=(400,))},
        "/findings": {"get": _operation("The findings of the analysis, per trial.",
                                        _object({"available": {"type": "boolean"}, "findings": {
                                            "type": "array", "items": _from_trial({
                                                "trial": {"type": "string"}, "findings": _ROWS,
                                                "refreshing": {"type": "boolean"}})}}),
                                        parameters=[_query("trial", {"type": "string"}, "Only this trial.")])},
        f"{t}/breakpoints": {
            "get": _operation("The breakpoints with their hit counts.",
                              _object({"breakpoints": {"type": "array", "items": _BREAKPOINT}}),
                              parameters=trial_only),
            "post": _operation("Add a breakpoint.", _BREAKPOINT, parameters=trial_only, status=201, changes=True,
                               errors=(400, 404, 413), body={
                                   "type": "object", "required": ["target", "condition"],
                                   "additionalProperties": False, "properties": {
                                       "target": {"type": "string", "description": "A node or a module name."},
                                       "condition": {"type": "string", "description": "e.g. grad_norm < 1e-3"},
                                       "enabled": {"type": "boolean"}}})},
        f"{t}/breakpoints/{{breakpoint_id}}": {
            "patch": _operation("Change a breakpoint.", _BREAKPOINT, changes=True, errors=(400, 404, 413),
                                parameters=[_TRIAL, _path("breakpoint_id", "As returned by POST.")], body={
                                    "type": "object", "additionalProperties": False, "properties": {
                                        "target": {"type": "string"}, "condition": {"type": "string"},
                                        "enabled": {"type": "boolean"}}}),
            "delete": _operation("Remove a breakpoint.", _object({"deleted": {"type": "string"}}), changes=True,
                                 parameters=[_TRIAL, _path("breakpoint_id", "As returned by POST.")])},
        f"{t}/run": {"get": _operation("The state of the run that records the trial.", _RUN, parameters=trial_only)},
        **{f"{t}/run/{action}": {"post": _operation(f"{text} a paused run.", _RUN, parameters=trial_only,
                                                      errors=(400, 404, 409), changes=True)}
           for action, text in (("continue", "Continue"), ("step", "Run one training step of"),
                                ("abort", "Abort"))},
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (a fresh copy: callers may change it)."""
    return copy.deepcopy({
        "openapi": "3.1.0",
        "info": {"title": "comgra REST API", "version": __version__,
                 "description": "Read a recording and control a live run. JSON only; nothing sent is executed."},
        "servers": [{"url": API_PREFIX}],
        "paths": _paths(),
        "components": {"securitySchemes": {"token": {
            "type": "http", "scheme": "bearer",
            "description": "Printed at start. Needed for state-changing calls (loopback included, unless the "
                           "server was started with --no-token), and for every call off loopback or with "
                           "--token-for-reads."}}},
    })
