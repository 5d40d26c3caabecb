"""The Health tab (issue 24, item 7): gradient norms per layer over the recorded steps as the test computed them,
the sentinels' events with links to the nearest recorded step, findings by node; through the service, the pure
builders and the real app over HTTP."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from comgra.server import health_view
from comgra.server.app import create_app
from comgra.service import RecordingService, wanted_from_query

torch = pytest.importorskip("torch")
NAN_STEP = 7  # not recorded: the policy records 0, 3, 6, 9


@pytest.fixture(scope="module")
def health_recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, float]]]:
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder

    root = tmp_path_factory.mktemp("health")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=3))
    recorder.track_module("net", net)
    recorder.track_optimizer(optimizer)
    norms: dict[int, dict[str, float]] = {}
    for step in range(10):
        x = torch.randn(4, 3)
        if step == NAN_STEP:
            x[1, 2] = math.inf * 0
        recorder.start_batch(step, 4)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        out = net(x)
        recorder.register_tensor("out", out)
        loss = out.pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        recorder.record_current_gradients("gradients")
        if recorder.recording_is_active():
            norms[step] = {layer: math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in net[index].parameters()))
                           for layer, index in (("net.0", 0), ("net.2", 2))}
        recorder.finish_iteration()
        recorder.finish_batch()
        if step < NAN_STEP:  # keep the parameters finite: the NaN is the batch's
            optimizer.step()
    recorder.finalize()
    return root / "group", norms


def test_the_service_answers_the_gradient_norms_and_events(health_recording) -> None:
    group, norms = health_recording
    service = RecordingService(group)
    try:
        health = service.training_health("trial", wait_seconds=60)
    finally:
        service.close()
    assert health.layers == ["net.0", "net.2"] and health.steps == sorted(norms)
    for column, step in enumerate(health.steps):
        for row, layer in enumerate(health.layers):
            if math.isfinite(norms[step][layer]):
                assert health.grad_norm[row][column] == pytest.approx(norms[step][layer], rel=1e-6)
    wanted = wanted_from_query(health.cell_links[0][1])
    assert wanted["training_step"] == 3 and wanted["node_id"] == "net.0.weight" and wanted["kind"] == "gradients"
    first = health.events[0]
    assert (first["training_step"], first["name"], first["event"], first["recorded"]) == (NAN_STEP, "x", "nan", False)  # the NaN comes in with the input
    assert first["shown_step"] == 9 and wanted_from_query(first["link"])["training_step"] == 9
    nodes = {entry["node"]: entry for entry in health.findings_by_node}
    assert nodes["x"]["error"] >= 1 and "not record" in nodes["x"]["top"]
    assert health.to_json()["layers"] == ["net.0", "net.2"]


def test_the_builders_draw_what_the_service_answered(health_recording) -> None:
    group, _ = health_recording
    service = RecordingService(group)
    try:
        health = service.training_health("trial")
    finally:
        service.close()
    content, figure, style, links, done = health_view.answer(health)
    assert style == {} and links["links"] == health.cell_links and done == (not health.pending)
    (heatmap,) = figure.data
    assert list(heatmap.y) == health.layers and list(heatmap.x) == [str(s) for s in health.steps]
    assert heatmap.z[1][0] == pytest.approx(math.log10(health.grad_norm[1][0]))
    click = {"points": [{"curveNumber": 0, "x": "6", "y": "net.2", "z": 0.1}]}  # what Dash hands over of a click
    assert health_view.cell_link(click, links).href == health.cell_links[1][2]
    assert "Sentinel events" in str(content)


def test_the_app_serves_the_tab(health_recording, app_latency) -> None:
    group, _ = health_recording
    app = create_app(group, poll_seconds=60)
    http = app.server.test_client()

    def get_json(path):
        response = http.get(path)
        assert response.status_code == 200, path
        return response.get_json()

    def post_json(path, payload):
        response = http.post(path, json=payload)
        assert response.status_code in (200, 204), response.data[:500]
        return response.get_json() if response.status_code == 200 else None

    client = app_latency.DashClient(get_json, post_json)
    answer = client.trigger("health-content.children", {"tabs.active_tab": "health"})["response"]
    assert answer["health-gradients"]["style"] == {}
    assert answer["health-gradients"]["figure"]["data"][0]["y"] == ["net.0", "net.2"]
    assert "nan" in str(answer["health-content"]["children"])
