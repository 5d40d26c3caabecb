"""The runinfo table against what the test reads from its own model, optimizer and autocast state (issue 24)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader


def _fields(rows: list[dict], step: int) -> dict[tuple[str, str, str], dict]:
    return {(r["subject"], r["name"], r["field"]): r for r in rows if r["training_step"] == step}


def test_runinfo_holds_the_runs_state_as_the_test_reads_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.25), torch.nn.Linear(4, 1))
    optimizer = torch.optim.AdamW([{"params": net[0].parameters(), "lr": 0.01, "weight_decay": 0.1},
                                   {"params": [net[2].weight], "lr": 0.0}], lr=0.5)
    net[2].bias.requires_grad_(False)
    recorder = ComgraRecorder(tmp_path, "group", "trial", DecisionMakerForRecordingsHardcoded({0, 2}))
    recorder.track_module("net", net)
    recorder.track_optimizer(optimizer)
    expected: dict[int, dict[str, tuple[float, float]]] = {}
    for step in range(3):
        if step == 2:
            net.eval()
        values = {f"net.{name}": (float(p.detach().double().sum()), float(p.detach().double().norm()))
                  for name, p in net.named_parameters()}
        x = torch.randn(5, 3)
        recorder.start_batch(step, 5, type_of_execution="train" if step < 2 else "eval")
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=step == 0):
            out = net(x)
            recorder.register_tensor("out", out)  # inside the forward pass (as comgra.watch's hooks register)
        loss = out.float().pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        recorder.record_current_gradients("gradients")
        grads = {f"net.{name}": float(p.grad.double().norm()) for name, p in net.named_parameters() if p.grad is not None}
        expected[step] = {"values": values, "grads": grads, "out_dtype": str(out.dtype).replace("torch.", "")}
        recorder.finish_iteration()
        recorder.finish_batch()
        optimizer.step()
    recorder.finalize()
    rows = GroupReader(tmp_path / "group").trial("trial").evidence("runinfo").to_pylist()
    assert sorted({r["training_step"] for r in rows}) == [0, 2]
    first, last = _fields(rows, 0), _fields(rows, 2)
    assert first[("step", "", "batch_size")]["number"] == 5
    assert first[("autocast", "cpu", "enabled")]["value"] == "True" and first[("autocast", "cpu", "dtype")]["value"] == "bfloat16"
    assert last[("autocast", "cpu", "enabled")]["value"] == "False"
    assert first[("tensor", "out", "dtype")]["value"] == expected[0]["out_dtype"] == "bfloat16"
    assert first[("tensor", "x", "requires_grad")]["value"] == "False"
    assert (first[("module", "net.1", "mode")]["value"], last[("module", "net.1", "mode")]["value"]) == ("train", "eval")
    assert first[("module", "net.1", "type")]["value"] == "Dropout" and first[("module", "net.1", "p")]["number"] == 0.25
    groups = {name: first[("parameter", name, "optimizer_group")]["value"] for name in
              ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias")}
    assert groups == {"net.0.weight": "optimizer0.group0", "net.0.bias": "optimizer0.group0",
                      "net.2.weight": "optimizer0.group1", "net.2.bias": ""}
    assert first[("optimizer_group", "optimizer0.group0", "weight_decay")]["number"] == 0.1
    assert first[("optimizer_group", "optimizer0.group1", "lr")]["number"] == 0.0
    assert first[("optimizer_group", "optimizer0.group1", "weight_decay")]["number"] == 0.01  # AdamW's default
    assert first[("parameter", "net.2.bias", "requires_grad")]["value"] == "False"
    for step, fields in ((0, first), (2, last)):
        for name, (total, norm) in expected[step]["values"].items():
            assert fields[("parameter", name, "value_sum")]["number"] == pytest.approx(total, rel=1e-9, abs=1e-12)
            assert fields[("parameter", name, "value_norm")]["number"] == pytest.approx(norm, rel=1e-9)
        for name, norm in expected[step]["grads"].items():
            assert fields[("parameter", name, "grad_norm")]["number"] == pytest.approx(norm, rel=1e-9)
        assert ("parameter", "net.2.bias", "grad_norm") not in fields  # frozen: no gradient


def test_a_dynamic_step_that_is_not_kept_leaves_no_runinfo(tmp_path: Path) -> None:
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType

    net = torch.nn.Linear(2, 1)
    recorder = ComgraRecorder(tmp_path, "group", "trial", DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=10))
    recorder.track_module("net", net)
    for step, kind in ((0, "a"), (1, "a")):  # step 1: type "a" was recorded at 0, so it is not kept
        recorder.start_batch(step, 2, type_of_execution=None)
        recorder.start_iteration()
        x = torch.randn(2, 2)
        recorder.register_tensor("x", x, is_input=True)
        recorder.register_tensor("y", net(x))
        recorder.finish_iteration()
        recorder.decide_recording_of_batch(kind, ["c", "c"])
        recorder.finish_batch()
    recorder.finalize()
    trial = GroupReader(tmp_path / "group").trial("trial")
    assert trial.steps()["training_step"].to_pylist() == [0]
    rows = trial.evidence("runinfo").to_pylist()
    assert {r["training_step"] for r in rows} == {0} and {r["type_of_execution"] for r in rows} == {"a"}


def test_the_gradient_fingerprints_are_unscaled_as_the_recorded_gradients(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    recorder = ComgraRecorder(tmp_path, "group", "trial", DecisionMakerForRecordingsHardcoded({0}))
    recorder.track_module("net", net)
    x = torch.randn(4, 3)
    recorder.start_batch(0, 4)
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    loss = net(x).pow(2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    (loss * 1024).backward()  # manual loss scaling
    recorder.record_current_gradients("gradients", loss_scale=1024)
    expected = float(net.weight.grad.double().norm()) / 1024
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    rows = GroupReader(tmp_path / "group").trial("trial").evidence("runinfo").to_pylist()
    (norm,) = [r["number"] for r in rows if r["name"] == "net.weight" and r["field"] == "grad_norm"]
    assert norm == pytest.approx(expected, rel=1e-9)
