"""comgra.watch gives the graph its roles: the model's input, its output, the loss ``backward()`` runs from
(also a KPI curve on every step), and each module's class beside its name; what the user named keeps its name."""
from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import comgra
from comgra.service import RecordingService

GROUP, TRIAL = "group", "trial"  # make_recorder's (tests/conftest.py)
B = 4


def _cnn() -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                   torch.nn.Linear(2 * 4 * 4, 3))


def _train(recorder: Any, model: Any, steps: int, generator: Any, *, own: bool = False) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        images = torch.randn(B, 1, 4, 4, generator=generator)
        labels = torch.randint(0, 3, (B,), generator=generator)
        recorder.start_batch(step, B)
        recorder.start_iteration()
        if own:
            recorder.register_tensor("images", images, is_input=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        if own:
            recorder.register_tensor("my_loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        recorder.record_current_gradients("gradients")
        optimizer.step()
        recorder.finish_iteration()
        recorder.finish_batch()
        losses.append(float(loss.detach()))
    recorder.finalize()
    return losses


def _read(store_root: Any) -> tuple[dict[str, dict], set[tuple[str, str]], list[dict], Any]:
    service = RecordingService(store_root / GROUP)
    try:
        document = service.graph_at(TRIAL, 0, 0)
        kpis = service.kpis(TRIAL).to_pylist()
        from comgra.server.graph_view import _client_node
        client = {n["id"]: _client_node(n, None, True, True) for n in document["nodes"]}
    finally:
        service.close()
    return {n["id"]: n for n in document["nodes"]}, {(e["source"], e["target"]) for e in document["edges"]}, kpis, client


def test_input_output_loss_and_module_types(make_recorder, store_root, generator) -> None:
    model = _cnn()
    recorder = make_recorder({0, 3})
    comgra.watch(model, recorder=recorder)
    losses = _train(recorder, model, 6, generator)
    nodes, edges, kpis, client = _read(store_root)
    assert nodes["model.input"]["role"] == "input" and nodes["model"]["role"] == "output"
    assert nodes["loss"]["role"] == "loss" and ("model", "loss") in edges and ("model.input", "model.0") in edges
    assert {n: nodes[n].get("module_type") for n in ("model", "model.0", "model.1", "model.2", "model.3")} == {
        "model": "Sequential", "model.0": "Conv2d", "model.1": "ReLU", "model.2": "Flatten", "model.3": "Linear"}
    assert "module_type" not in nodes["loss"] and "module_type" not in nodes["model.0.weight"]
    assert client["model.1"]["label"] == "model.1 (ReLU)" and client["model.1"]["module_type"] == "ReLU"
    curve = sorted((k["timepoint"], k["value"]) for k in kpis if k["kpi_group"] == "loss")
    assert [t for t, _ in curve] == list(range(6))  # every step, recorded or not
    assert [v for _, v in curve] == pytest.approx(losses, rel=1e-5)


def test_what_the_user_named_keeps_its_name(make_recorder, store_root, generator) -> None:
    model = _cnn()
    recorder = make_recorder({0})
    comgra.watch(model, recorder=recorder)
    _train(recorder, model, 2, generator, own=True)
    nodes, edges, _, _ = _read(store_root)
    assert nodes["images"]["role"] == "input" and "model.input" not in nodes
    assert nodes["my_loss"]["role"] == "loss" and "loss" not in nodes and ("model", "my_loss") in edges


def test_a_fault_in_the_loss_hook_never_stops_the_training(make_recorder, store_root, generator, monkeypatch) -> None:
    from comgra.integrations import watch as watch_module

    model = _cnn()
    recorder = make_recorder({0})
    handle = comgra.watch(model, recorder=recorder)

    def broken(self: Any, tensor: Any) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(watch_module.Watch, "saw_backward", broken)
    with pytest.warns(RuntimeWarning, match="stopped recording the loss.*planted"):
        losses = _train(recorder, model, 3, generator)
    assert len(losses) == 3 and not handle.active
    assert all(p.grad is not None for p in model.parameters())  # the backward pass itself ran
