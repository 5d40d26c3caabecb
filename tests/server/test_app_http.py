"""The real app over HTTP (Flask's test client): each callback answers with the store's numbers."""
from __future__ import annotations

import pytest

from comgra.server.app import create_app
from comgra.server.tensors import VALUES_ROUTE
from comgra.service import parse_aggregation
from comgra.store import GroupReader
from comgra.store import format as fmt


@pytest.fixture
def client(recording, app_latency):
    app = create_app(recording, poll_seconds=60)
    http = app.server.test_client()

    def get_json(path):
        response = http.get(path)
        assert response.status_code == 200, path
        return response.get_json()

    def post_json(path, payload):
        response = http.post(path, json=payload)
        assert response.status_code in (200, 204), response.data[:500]
        return response.get_json() if response.status_code == 200 else None

    return app_latency.DashClient(get_json, post_json)


def expected_statistics(recording, shown) -> dict:
    aggregation, sample = parse_aggregation(shown["aggregation"])
    (row,) = GroupReader(recording).trial(shown["trial"]).selection(
        training_step=shown["training_step"], kind=shown["kind"], iteration=shown["data_iteration"],
        node=shown["node"], role=shown["role"], aggregation=aggregation, sample=sample).to_pylist()
    return {name: row[name] for name in (*fmt.STATISTICS, *(["svd_max"] if row["svd_max"] is not None else []))}


def test_the_page_and_its_assets_are_served_locally(recording):
    http = create_app(recording).server.test_client()
    page = http.get("/").get_data(as_text=True)
    assert "comgra.css" in page and "00_bootstrap.min.css" in page and "comgra.js" in page
    assert "cdn" not in page.lower() and "unpkg" not in page.lower()
    with http.get("/assets/comgra.js") as response:
        assert response.status_code == 200


def test_every_interaction_shows_the_stores_numbers(client, recording):
    client.trigger("selection.data")
    assert client.statistics() == expected_statistics(recording, client.shown())
    options = [o["value"] for o in client.props[("aggregation-select", "options")]]
    changes = [
        {"node-click.data": {"id": "subnet_mem__out", "t": 1}},
        {"aggregation-select.value": options[4]},
        {"kind-select.value": "gradients"},
        {"step-slider.value": 3},
        {"step-next.n_clicks": 1},
        {"iteration-slider.value": 1},
        {"node-search.value": "subnet_pre"},
        {"role-select.value": "weight1"},
        {"node-click.data": {"id": "output", "t": 2}},
        {"trial-select.value": "trial_no_activation_function_on_output_layer"},
        {"type-select.value": "01_iterations"},
        {"step-input.value": 57},
    ]
    for change in changes:
        client.trigger("selection.data", change)
        shown = client.shown()
        assert shown is not None, change
        assert client.statistics() == expected_statistics(recording, shown), change
    assert shown["trial"] == "trial_no_activation_function_on_output_layer" and shown["step_type"] == "01_iterations"


def test_the_series_and_the_tabs_answer(client):
    client.trigger("selection.data")
    graph = client.trigger("series-plot.children", {"shown.data": client.shown()})["response"]["series-plot"]["children"]
    figure = graph["props"]["figure"]
    assert len(figure["data"]) == 2
    for component, tab in [("network", "network"), ("notes", "notes"), ("kpi-graphs", "graphs")]:
        response = client.trigger(f"{component}.children", {"tabs.active_tab": tab})
        assert response["response"][component]["children"], component


def test_polling_answers_nothing_when_nothing_changed(client):
    response = client.trigger("data-version.data", {"poll.n_intervals": 1})
    assert not (response or {}).get("response")


def test_the_values_route_answers_a_click_as_the_view_callback_does(client, recording):
    """The page draws a click's values from the values route before Dash's answer: the two must agree."""
    client.trigger("selection.data")
    client.trigger("selection.data", {"kind-select.value": "gradients"})
    client.trigger("selection.data", {"node-click.data": {"id": "subnet_mem__out", "t": 0}})
    client.trigger("selection.data", {"aggregation-select.value": "sample:2"})  # wishes the route must keep
    for t, node in enumerate(["output", "subnet_pre", "input", "loss", "helper_partial_sums", "subnet_mem__out"]):
        early = client.click_values(node)
        client.trigger("selection.data", {"node-click.data": {"id": node, "t": t + 1}})
        values = client.props[("values-data", "data")]
        assert early == {"node_id": node, "values": values}, node
        shown = client.shown()  # "loss" is missing in this iteration: both show the same fallback
        assert client.statistics() == expected_statistics(recording, shown)
    assert shown["aggregation"] == "sample:2" and shown["kind"] == "gradients"


def test_the_values_route_answers_a_step_button_as_the_view_callback_does(client, recording):
    """The previous / next step buttons draw their values from the values route too, before Dash's answer."""
    client.trigger("selection.data")
    client.trigger("selection.data", {"node-click.data": {"id": "subnet_mem__out", "t": 0}})
    for clicks, trigger in enumerate(["step_next", "step_next", "step_prev", "step_next"], start=1):
        before = client.shown()["training_step"]
        early = client._post(VALUES_ROUTE, {"selection": client.props.get(("selection", "data")), "trigger": trigger})
        button = "step-next" if trigger == "step_next" else "step-prev"
        client.trigger("selection.data", {f"{button}.n_clicks": clicks})
        shown = client.shown()
        assert shown["training_step"] != before and shown["node_id"] == "subnet_mem__out", trigger
        assert early == {"node_id": "subnet_mem__out", "values": client.props[("values-data", "data")]}, trigger
        assert client.statistics() == expected_statistics(recording, shown)


@pytest.mark.parametrize("body", [[1], "x", None, {"node_id": 5}, {"node_id": "output", "selection": [2]},
                                  {"node_id": "output", "selection": {"shown": {"trial": 1}, "wanted": "w"}}])
def test_the_values_route_takes_any_body(recording, body):
    http = create_app(recording, poll_seconds=60).server.test_client()
    response = http.post("/_comgra/values", json=body)
    assert response.status_code == 200 and set(response.get_json()) == {"node_id", "values"}


@pytest.mark.parametrize("findings_scan", [True, False])
def test_without_the_findings_scan_the_page_starts_no_scan(fresh_recording, app_latency, monkeypatch, findings_scan):
    """``comgra --no-findings-scan``: the page's view, its badges and the REST API's findings answer at
    once and scan nothing (by default the same requests scan the trials). A fresh recording: one that
    an earlier test scanned holds saved findings, which are shown without a scan."""
    recording = fresh_recording
    import time

    from comgra.service.findings import FindingsWorker

    scanned: list[str] = []
    monkeypatch.setattr(FindingsWorker, "_scan", lambda self, trial: scanned.append(trial))
    app = create_app(recording, poll_seconds=60, warm_up=False, findings_scan=findings_scan)
    http = app.server.test_client()
    client = app_latency.DashClient(lambda path: http.get(path).get_json(),
                                    lambda path, payload: http.post(path, json=payload).get_json())
    client.trigger("selection.data")
    client.trigger("findings-badge-version.data", {"current-trial.data": client.props[("current-trial", "data")]})
    if not findings_scan:
        response = http.get("/api/v1/findings")
        assert response.status_code == 200 and all(t["findings"] == [] for t in response.get_json()["findings"])
    deadline = time.monotonic() + 10
    while findings_scan and not scanned and time.monotonic() < deadline:
        time.sleep(0.05)
    assert bool(scanned) == findings_scan
