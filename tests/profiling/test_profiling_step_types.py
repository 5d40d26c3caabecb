"""Profiled evaluation steps that share a training step's number (issue 31 item 4: a step is (number, type)).

The layers table carries each row's type_of_execution; the Profile tab, REST and the flame graph read one type at a
time where several share numbers; the profile_spikes detector compares a step only with steps of its type, so an
evaluation run at a training step's number is not that training step turning slow.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra.analysis.scan import Scanner  # noqa: E402
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402
from comgra.service import RecordingService  # noqa: E402
from comgra.store.reader import GroupReader  # noqa: E402

STEPS = 40
EVALUATED_AT = (10, 20, 30)  # an evaluation after these training steps, under the same number (as the Trainer's)
TRAIN_SLEEP, EVAL_SLEEP = 0.002, 0.06  # a long evaluation forward: 30x a training forward


class _Slow(torch.nn.Module):
    """Waits longer in evaluation mode (a stand-in for evaluating a whole validation set in one pass)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(TRAIN_SLEEP if self.training else EVAL_SLEEP)
        return self.linear(x)


def _record(root: Path) -> Path:
    torch.manual_seed(0)
    net = torch.nn.Sequential(_Slow(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=10))
    recorder.track_module("net", net, profile=True)
    for step in range(STEPS):
        x = torch.randn(8, 4)
        recorder.start_batch(step, 8, type_of_execution="training")
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        loss = net(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        recorder.finish_iteration()
        recorder.finish_batch()
        optimizer.step()
        if step in EVALUATED_AT:
            net.eval()
            with torch.no_grad():
                recorder.start_batch(step, 8, type_of_execution="evaluation")
                recorder.start_iteration()
                x = torch.randn(8, 4)
                recorder.register_tensor("x", x, is_input=True)
                recorder.register_tensor("loss", net(x).pow(2).mean(), is_loss=True)
                recorder.add_tensor_connection("x", "loss")  # under no_grad autograd shows no edge
                recorder.finish_iteration()
                recorder.finish_batch()
            net.train()
    recorder.finalize()
    return root / "group"


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("profile_types"))


def _rows(group: Path) -> list[dict[str, Any]]:
    reader = GroupReader(group)
    try:
        return reader.trial("trial").layers().to_pylist()
    finally:
        reader.close()


def test_each_profiled_row_carries_its_steps_type(group: Path) -> None:
    rows = _rows(group)
    kinds = {(r["training_step"], r["type_of_execution"]) for r in rows if r["module"] == "net.0"}
    assert kinds == {(step, "training") for step in range(STEPS)} | {(step, "evaluation") for step in EVALUATED_AT}
    for step in EVALUATED_AT:  # the same number, two executions: each its own time
        of = {r["type_of_execution"]: r["forward_time"] for r in rows if r["module"] == "net.0"
              and r["training_step"] == step}
        assert of["evaluation"] >= EVAL_SLEEP > of["training"]


def test_the_service_reads_one_type_at_a_time(group: Path) -> None:
    service = RecordingService(group)
    try:
        assert service.layer_types("trial") == ["training", "evaluation"]  # the most profiled first
        summary = {r["module"]: r for r in service.profile_summary("trial", execution="evaluation")}
        assert summary["net.0"]["calls"] == len(EVALUATED_AT) and summary["net.0"]["mean"] >= EVAL_SLEEP
        training = {r["module"]: r for r in service.profile_summary("trial", execution="training")}
        assert training["net.0"]["calls"] == STEPS
        every = {r["module"]: r for r in service.profile_summary("trial")}
        assert every["net.0"]["calls"] == STEPS + len(EVALUATED_AT)  # no type: all of them, as before
        trace = service.chrome_trace("trial", execution="evaluation")["traceEvents"]
        assert {e["args"]["type_of_execution"] for e in trace if e.get("ph") == "X"} == {"evaluation"}
    finally:
        service.close()


def test_an_evaluation_sharing_a_steps_number_is_not_a_slow_training_step(group: Path) -> None:
    """Summed with the training step of its number, each evaluation looked like a 30x stall of net.0."""
    findings = [f for f in Scanner().scan(group).findings if f.detector == "profile_spikes"]
    # A loaded machine may stall any layer for some ms (an info finding anywhere); the evaluation's 60 ms are planted.
    assert not [f for f in findings if f.training_step in EVALUATED_AT and f.evidence.get("value", 0) >= EVAL_SLEEP], \
        findings


def test_rest_answers_one_type_when_asked(group: Path) -> None:
    from comgra.server.app import create_app

    app = create_app(group, warm_up=False)
    try:
        client = app.server.test_client()
        rows = _rows(group)
        for kind in ("training", "evaluation", None):
            query = f"?execution={kind}" if kind else ""
            answer = client.get(f"/api/v1/trials/trial/profile{query}").get_json()
            calls = {r["module"]: r["calls"] for r in answer["layers"]}
            expected = sum(1 for r in rows if r["module"] == "net.0" and kind in (None, r["type_of_execution"]))
            assert calls["net.0"] == expected, (kind, answer)
        nodes = client.get("/api/v1/trials/trial/flamegraph?execution=evaluation").get_json()["nodes"]
        assert {n["name"]: n["calls"] for n in nodes}["net.0"] == len(EVALUATED_AT)
    finally:
        app.server.config.clear()
