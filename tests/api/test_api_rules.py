"""The API's rules beyond the document: tokens off loopback, other origins, body limits, nothing executed,
and answers that equal the store's."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from comgra.store import layout

TRIAL = "trial"


def test_off_loopback_state_changes_need_the_printed_token(profiled_group: Path, capsys: Any) -> None:
    from comgra.server.app import create_app, make_http_server

    app = create_app(profiled_group, warm_up=False)
    server = make_http_server(app, host="0.0.0.0", port=0)
    try:
        token = app.server.config["COMGRA_API_TOKEN"]
        assert token and len(token) >= 24
        client = app.server.test_client()
        body = {"target": "loss", "condition": "has_nan"}
        reading = client.get(f"/api/v1/trials/{TRIAL}/breakpoints")  # off loopback, reading needs it too
        assert reading.status_code == 401 and reading.json["error"]["field"] == "Authorization"
        assert client.get(f"/api/v1/trials/{TRIAL}/breakpoints",
                          headers={"Authorization": f"Bearer {token}"}).status_code == 200
        refused = client.post(f"/api/v1/trials/{TRIAL}/breakpoints", json=body)
        assert refused.status_code == 401 and refused.json["error"]["field"] == "Authorization"
        wrong = client.post(f"/api/v1/trials/{TRIAL}/breakpoints", json=body, headers={"Authorization": "Bearer x"})
        assert wrong.status_code == 401
        created = client.post(f"/api/v1/trials/{TRIAL}/breakpoints", json=body,
                              headers={"Authorization": f"Bearer {token}"})
        assert created.status_code == 201
        client.delete(f"/api/v1/trials/{TRIAL}/breakpoints/{created.json['id']}",
                      headers={"Authorization": f"Bearer {token}"})
    finally:
        server.server_close()


def test_on_loopback_no_token_but_other_origins_are_refused(client: Any) -> None:
    body = {"target": "loss", "condition": "has_nan"}
    foreign = client.post(f"/api/v1/trials/{TRIAL}/breakpoints", json=body, headers={"Origin": "http://evil.example"})
    assert foreign.status_code == 403 and foreign.json["error"]["field"] == "Origin"
    created = client.post(f"/api/v1/trials/{TRIAL}/breakpoints", json=body, headers={"Origin": "http://localhost"})
    assert created.status_code == 201
    assert client.delete(f"/api/v1/trials/{TRIAL}/breakpoints/{created.json['id']}").status_code == 200


def test_nothing_sent_is_executed(client: Any, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for condition in (f"__import__('os').system('touch {marker}')", f"open('{marker}', 'w')",
                      "(lambda: 1)()", "mean.__class__"):
        answer = client.post(f"/api/v1/trials/{TRIAL}/breakpoints", json={"target": "loss", "condition": condition})
        assert answer.status_code == 400 and answer.json["error"]["field"] == "condition", condition
    assert not marker.exists()


@pytest.mark.parametrize(("url", "field"), [
    (f"/api/v1/trials/{TRIAL}/graph", "step"), (f"/api/v1/trials/{TRIAL}/graph?step=1.5", "step"),
    (f"/api/v1/trials/{TRIAL}/graph?step=99", "step"), (f"/api/v1/trials/{TRIAL}/graph?step=0&iteration=7", "iteration"),
    (f"/api/v1/trials/{TRIAL}/values?step=0&node=nope", "node"), (f"/api/v1/trials/{TRIAL}/values?step=0&stpe=1", "stpe"),
    (f"/api/v1/trials/{TRIAL}/series?node=loss", "role"), (f"/api/v1/trials/{TRIAL}/profile?phase=sideways", "phase"),
    (f"/api/v1/trials/{TRIAL}/layers/net.nope", "module"), ("/api/v1/trials/nope/layers", "trial"),
    (f"/api/v1/trials/{TRIAL}/run/explode", "action"), (f"/api/v1/trials/{TRIAL}/steps?rank=3", "rank"),
])
def test_a_bad_value_is_a_4xx_naming_the_field(client: Any, url: str, field: str) -> None:
    method = client.post if "/run/" in url else client.get
    answer = method(url)
    assert 400 <= answer.status_code < 500 and answer.json["error"]["field"] == field, answer.json


def test_a_body_beyond_the_limit_is_refused(client: Any) -> None:
    answer = client.post(f"/api/v1/trials/{TRIAL}/breakpoints", data=b"{" + b" " * (5 * 1024 * 1024) + b"}",
                         content_type="application/json")
    assert answer.status_code == 413


def test_answers_equal_the_store(client: Any, profiled_group: Path) -> None:
    import pyarrow.dataset as ds

    layers = ds.dataset(str(layout.trial_partition(profiled_group, "layers", TRIAL)), format="parquet", partitioning="hive").to_table().to_pylist()
    head = [r for r in layers if r["module"] == "net.head"]
    answer = client.get(f"/api/v1/trials/{TRIAL}/layers/net.head?limit=2").json["executions"]
    assert [r["forward_time"] for r in answer] == [r["forward_time"] for r in head][-2:]
    profile = client.get(f"/api/v1/trials/{TRIAL}/profile").json["layers"]
    top = profile[0]
    assert top["module"] == "net" and top["calls"] == sum(r["module"] == "net" for r in layers)
    assert top["total"] == pytest.approx(sum(r["forward_time"] for r in layers if r["module"] == "net"))
    kpis = ds.dataset(str(layout.trial_partition(profiled_group, "kpis", TRIAL)), format="parquet", partitioning="hive").to_table().to_pylist()
    served = client.get(f"/api/v1/trials/{TRIAL}/kpis").json["kpis"]
    assert sorted(k["value"] for k in served) == sorted(k["value"] for k in kpis)
    tensors = ds.dataset(str(layout.trial_partition(profiled_group, "tensors", TRIAL)), format="parquet", partitioning="hive").to_table().to_pylist()
    loss = next(r for r in tensors if r["node"] == "loss" and r["training_step"] == 2 and r["kind"] == "forward")
    values = client.get(f"/api/v1/trials/{TRIAL}/values?step=2&node=loss").json
    assert values["values"]["mean"] == pytest.approx(loss["mean"])
    assert values["app_link"].startswith("/?tab=tensors&trial=trial&step=2")
    series = client.get(f"/api/v1/trials/{TRIAL}/series?node=loss&role=loss&aggregation=none").json
    assert series["training_step"] == [0, 2]
