"""Hostile HTTP: foreign Host headers, huge bodies and junk callback state never reach a 500 or a traceback."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comgra.server.app import MAX_REQUEST_BYTES, allowed_hosts, create_app, make_http_server

UPDATE = "/_dash-update-component"


@pytest.fixture(scope="module")
def app(recording):
    return create_app(recording, poll_seconds=60, warm_up=False)


@pytest.fixture(scope="module")
def http(app):
    return app.server.test_client()


@pytest.fixture(scope="module")
def valid_bodies(http) -> list[dict[str, Any]]:
    """One well-formed request per server-side callback, with the values the page starts with."""
    layout = http.get("/_dash-layout").get_json()
    props: dict[tuple[str, str], Any] = {}
    _collect(layout, props)
    bodies = []
    for callback in http.get("/_dash-dependencies").get_json():
        if callback.get("clientside_function"):
            continue
        with_value = [
            [{**d, **({"value": props[(d["id"], d["property"])]} if (d["id"], d["property"]) in props else {})}
             for d in callback[part]] for part in ("inputs", "state")]
        bodies.append({"output": callback["output"], "outputs": _outputs(callback["output"]),
                       "inputs": with_value[0], "state": with_value[1],
                       "changedPropIds": [f"{callback['inputs'][0]['id']}.{callback['inputs'][0]['property']}"]})
    return bodies


def _collect(node: Any, props: dict[tuple[str, str], Any]) -> None:
    if isinstance(node, list):
        for item in node:
            _collect(item, props)
    elif isinstance(node, dict):
        inner = node.get("props") if "props" in node and "type" in node else None
        if inner is not None:
            if isinstance(inner.get("id"), str):
                props.update({(inner["id"], k): v for k, v in inner.items() if k != "children"})
            _collect(inner.get("children"), props)


def _outputs(spec: str) -> Any:
    if not spec.startswith(".."):
        component, prop = spec.rsplit(".", 1)
        return {"id": component, "property": prop}
    return [dict(zip(("id", "property"), part.rsplit(".", 1))) for part in spec.strip(".").split("...")]


def assert_clean(response) -> None:
    text = response.get_data(as_text=True)
    assert response.status_code != 500 and response.status_code < 600, text[:300]
    assert "Traceback" not in text and 'File "' not in text, text[:300]


# -- Host header ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("host, allowed", [
    ("localhost", True), ("localhost:8055", True), ("127.0.0.1:8055", True), ("[::1]:8055", True),
    ("LOCALHOST", True), ("attacker.example", False), ("attacker.example:8055", False),
    ("localhost.attacker.example", False), ("127.0.0.1.nip.io", False), ("", False),
])
def test_only_local_host_names_are_answered_by_default(http, host: str, allowed: bool) -> None:
    response = http.get("/", headers={"Host": host})
    assert (response.status_code == 200) == allowed, (host, response.status_code)
    if not allowed:
        assert response.status_code == 403 and response.mimetype == "text/plain"
        assert "--allow-host" in response.get_data(as_text=True)


@pytest.mark.parametrize("bound, extra, host, allowed", [
    ("127.0.0.1", (), "localhost:1", True),
    ("127.0.0.1", (), "evil.example", False),
    ("127.0.0.1", ("lab.example",), "lab.example:8055", True),
    ("::1", (), "[::1]:8055", True),
    ("0.0.0.0", (), "anything.example", True),
    ("10.1.2.3", (), "10.1.2.3:8055", True),
    ("10.1.2.3", (), "localhost", False),
    ("10.1.2.3", (), "evil.example", False),
])
def test_the_hosts_allowed_follow_the_bound_address(bound, extra, host, allowed) -> None:
    names = allowed_hosts(bound, extra)
    name = host.lower().rsplit(":", 1)[0] if not host.startswith("[") else host[1:host.index("]")]
    assert (names is None or name in names) == allowed


def test_a_server_bound_to_loopback_refuses_foreign_hosts(recording) -> None:
    app = create_app(recording, warm_up=False)
    server = make_http_server(app, host="127.0.0.1", port=0, allow_hosts=["lab.example"])
    try:
        client = app.server.test_client()
        assert client.get("/", headers={"Host": f"127.0.0.1:{server.server_port}"}).status_code == 200
        assert client.get("/", headers={"Host": "lab.example"}).status_code == 200
        assert client.get("/", headers={"Host": "rebound.example"}).status_code == 403
    finally:
        server.server_close()


# -- body size -----------------------------------------------------------------------------------------
def test_a_huge_body_is_refused_with_413(http, valid_bodies) -> None:
    body = {**valid_bodies[0], "junk": "x" * (MAX_REQUEST_BYTES + 1)}
    response = http.post(UPDATE, data=json.dumps(body), content_type="application/json")
    assert response.status_code == 413
    assert_clean(response)


# -- callback bodies -----------------------------------------------------------------------------------
HOSTILE_VALUES = [10**400, -10**400, 2**63, 1e308, float("inf"), True, "", "x" * 10_000, [], {}, [[[[[]]]]],
                  {"wanted": 5, "shown": "x"}, {"trial": 1, "training_step": "ten"}, None,
                  {"wanted": {"training_step": 10**400, "node_id": [1], "roles": [1], "aggregation": "sample:x"},
                   "shown": {"trial": 1}}]
json_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=10**18, max_value=10**400)
    | st.floats(allow_nan=False) | st.text(max_size=12) | st.sampled_from(HOSTILE_VALUES[:12]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["wanted", "shown", "trial", "training_step", "node_id", "roles", "aggregation", "kind",
                         "iteration", "id", "node", "role", "data_iteration", "step_type", "type_of_execution"])
        | st.text(max_size=6), inner, max_size=6),
    max_leaves=15)


@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=[f"v{i}" for i in range(len(HOSTILE_VALUES))])
def test_every_callback_answers_hostile_values_cleanly(http, valid_bodies, value) -> None:
    for body in valid_bodies:
        for part in ("inputs", "state"):
            for i in range(len(body[part])):
                hostile = json.loads(json.dumps(body))
                hostile[part][i]["value"] = value
                assert_clean(http.post(UPDATE, data=json.dumps(hostile), content_type="application/json"))


def test_a_shown_selection_with_a_huge_step_does_not_mark_chunks_damaged(app, http, valid_bodies, recording):
    from comgra.store import GroupReader
    (body,) = [b for b in valid_bodies if "series-plot" in b["output"]]
    trial = GroupReader(recording).trials()[0]
    shown = {"trial": trial, "type_of_execution": "__any__", "training_step": 10**400, "step_type": "x", "iteration": 0,
             "node_id": "x", "node": "x", "data_iteration": 0, "role": "x", "kind": "forward", "aggregation": "mean"}
    hostile = json.loads(json.dumps(body))
    hostile["inputs"][0]["value"] = shown
    assert_clean(http.post(UPDATE, data=json.dumps(hostile), content_type="application/json"))
    assert all("Skipped" not in b for b in _banners_of_a_fresh_view(http, valid_bodies))


def _banners_of_a_fresh_view(http, valid_bodies) -> list[str]:
    (body,) = [b for b in valid_bodies if "banner" in b["output"]]
    response = http.post(UPDATE, data=json.dumps(body), content_type="application/json").get_json()
    return [json.dumps(response["response"].get("banner", {}))]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_callback_bodies_never_get_a_500_or_a_traceback(http, valid_bodies, data) -> None:
    body = json.loads(json.dumps(data.draw(st.sampled_from(valid_bodies))))
    for part in ("inputs", "state"):
        for dependency in body[part]:
            if data.draw(st.booleans()):
                dependency["value"] = data.draw(json_junk)
    mutation = data.draw(st.sampled_from(["values", "drop_key", "retype_key", "extra_key", "not_an_object"]))
    if mutation == "drop_key":
        body.pop(data.draw(st.sampled_from(sorted(body))))
    elif mutation == "retype_key":
        body[data.draw(st.sampled_from(sorted(body)))] = data.draw(json_junk)
    elif mutation == "extra_key":
        body[data.draw(st.text(max_size=8))] = data.draw(json_junk)
    elif mutation == "not_an_object":
        body = data.draw(json_junk)
    assert_clean(http.post(UPDATE, data=json.dumps(body), content_type="application/json"))


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe", b"null", b"[]", b'"x"', b"1e999", b"[" * 100_000])
def test_bodies_that_are_not_callback_json_get_a_4xx(http, raw: bytes) -> None:
    response = http.post(UPDATE, data=raw, content_type="application/json")
    assert_clean(response)
    assert 400 <= response.status_code < 500
