"""Contract tests: the OpenAPI document is valid, and every route it lists answers as it says,
for valid and for malformed input (schemathesis generates both from the document)."""
from __future__ import annotations

from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402


def test_the_document_is_valid_openapi() -> None:
    from openapi_spec_validator import validate

    from comgra.server.api_spec import openapi_document

    validate(openapi_document())


def test_the_document_lists_every_route(api_app: Any) -> None:
    """Every route the server has under /api/v1 is in the document, and the other way round."""
    from comgra.server.api_spec import API_PREFIX, openapi_document

    served = set()
    for rule in api_app.url_map.iter_rules():
        if rule.rule.startswith(API_PREFIX) and "<path:rest>" not in rule.rule:
            path = rule.rule[len(API_PREFIX):].replace("<", "{").replace(">", "}")
            for method in rule.methods - {"HEAD", "OPTIONS"}:
                served.add((path, method.lower()))
    documented = {(path, method) for path, item in openapi_document()["paths"].items() for method in item}
    # /run/<action> is one rule for the three documented actions.
    served = {(p, m) for p, m in served if p != "/trials/{trial}/run/{action}"} | {
        (f"/trials/{{trial}}/run/{a}", "post") for a in ("continue", "step", "abort")}
    assert documented == served - {("/", "get"), ("/openapi.json", "get")}


def _operations() -> list[tuple[str, str]]:
    from comgra.server.api_spec import openapi_document

    return [(method, path) for path, item in openapi_document()["paths"].items() for method in item]


def _schema(api_app: Any) -> Any:
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", api_app)


def _operation(api_app: Any, method: str, path: str) -> Any:
    return next(result.ok() for result in _schema(api_app).get_all_operations()
                if result.ok().method == method and result.ok().path == path)


def _has_body(method: str, path: str) -> bool:
    from comgra.server.api_spec import openapi_document

    return "requestBody" in openapi_document()["paths"][path][method]


def _takes_input(method: str, path: str) -> bool:
    """Whether a request can be malformed beyond its path: it has query parameters or a body."""
    from comgra.server.api_spec import openapi_document

    operation = openapi_document()["paths"][path][method]
    return "requestBody" in operation or any(p["in"] == "query" for p in operation["parameters"])


@pytest.mark.parametrize(("method", "path"), _operations())
def test_every_route_keeps_its_contract(api_app: Any, method: str, path: str) -> None:
    """Generated requests, on the recorded trial and on made-up ones: never a 500, always a documented
    status, content type and body."""
    from profiled_recording import TRIAL

    operation = _operation(api_app, method, path)
    strategies = [operation.as_strategy()]
    if "{trial}" in path:
        strategies.append(operation.as_strategy(path_parameters={"trial": TRIAL}))
    if "{module}" in path:
        strategies.append(operation.as_strategy(path_parameters={"trial": TRIAL, "module": "net.b1"}))

    # A breakpoint's condition has a grammar no JSON schema states: a schema-valid body may be refused (400,
    # naming the field), so for bodies the check that valid data is accepted does not apply. Nor for /runs'
    # filter, a regular expression: "(" is a string the schema allows and a 400 naming the filter.
    excluded = [schemathesis.checks.positive_data_acceptance] if _has_body(method, path) or path == "/runs" else []

    @given(case=st.one_of(strategies))
    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: Any) -> None:
        case.call_and_validate(excluded_checks=excluded)

    check()


@pytest.mark.parametrize(("method", "path"), [op for op in _operations() if _takes_input(*op)])
def test_malformed_input_is_a_4xx(api_app: Any, method: str, path: str) -> None:
    """Requests that break the document (wrong types, missing or unknown fields): a 4xx, never a 2xx or 5xx."""
    from profiled_recording import TRIAL

    operation = _operation(api_app, method, path)
    parameters = {"trial": TRIAL, "module": "net.b1"} if "{module}" in path else {"trial": TRIAL}
    strategy = operation.as_strategy(generation_mode=GenerationMode.NEGATIVE, path_parameters=parameters)

    @given(case=strategy)
    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: Any) -> None:
        # schemathesis's own judgement of what is malformed on the wire (an empty list sent as a query
        # value is no value at all): such a request must get a 4xx, and nothing may get a 5xx.
        response = case.call_and_validate(checks=[schemathesis.checks.negative_data_rejection,
                                                  schemathesis.checks.not_a_server_error])
        if response.status_code >= 400:
            assert response.json()["error"]["message"]

    check()
