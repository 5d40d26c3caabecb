"""Dropout left on in evaluation through the functional interface (issue 32): ``F.dropout(x, p)`` (``training``
defaults to True) or ``F.dropout(x, p, training=True)`` in a module's forward, so ``model.eval()`` does not switch
it off and no dropout module is in training mode. Real loops recorded with the documented API and scanned; the
healthy variants (an ``nn.Dropout`` module used right, ReLU zeros, sparse inputs, whole samples masked, small
values shrunk to zero, a pooled head whose values do not align with its input's, the fixed twin) must stay silent."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from evidence_runs import scan, serious

import comgra
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder

BATCH = 16


class Block(torch.nn.Module):
    """Linear, an activation, then the variant's way of dropping (or masking) values."""

    def __init__(self, variant: str) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(12, 24)
        self.dropout = torch.nn.Dropout(0.4)
        self.act = torch.nn.ReLU()
        self.variant = variant
        if variant == "pooled":  # 48 units pooled in pairs; four pairs dead: their pooled values are zero
            self.fc = torch.nn.Linear(12, 48)
            with torch.no_grad():
                self.fc.weight[[2, 3, 6, 7, 10, 11, 14, 15]] = 0.0
                self.fc.bias[[2, 3, 6, 7, 10, 11, 14, 15]] = -20.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x)) if self.variant != "relu" else torch.relu(self.fc(x))
        if self.variant == "default_training":
            return F.dropout(h, 0.4)
        if self.variant == "training_true":
            return F.dropout(h, p=0.4, training=True)
        if self.variant == "fixed":
            return F.dropout(h, 0.4, training=self.training)
        if self.variant in ("module", "module_left_on"):
            return self.dropout(h)
        if self.variant == "masked":  # padding: whole samples zeroed, in training and evaluation alike
            keep = (torch.arange(h.shape[0]) % 4 != 0).to(h.dtype)[:, None]
            return h * keep
        if self.variant == "pooled":  # a ReLU's units pooled in pairs, then an nn.Dropout: value i of one is not
            pooled = self.act(h).view(h.shape[0], 24, 2).mean(dim=2)  # value i of the other (MobileNet's pooled head)
            return self.dropout(pooled)
        if self.variant == "shrink":  # the small values zeroed, in training and evaluation alike
            return F.hardshrink(h, 0.3)
        return h  # "relu", "sparse"


def record(directory: Path, variant: str) -> list:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Tanh(), Block(variant), torch.nn.Linear(24, 1))
    recorder = ComgraRecorder(directory, "group", variant,
                              DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=1))
    watch = comgra.watch(net, recorder=recorder, name="net")
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    for step in range(24):
        evaluation = step % 4 == 3
        x = torch.randn(BATCH, 12, generator=generator)
        if variant == "sparse":  # about 70% of the features exactly zero
            x = x * (torch.rand(BATCH, 12, generator=generator) > 0.7)
        y = torch.randn(BATCH, 1, generator=generator)
        net.train(not evaluation or variant == "module_left_on")  # model.eval() forgotten: the module's finding
        recorder.start_batch(step, BATCH, type_of_execution="evaluation" if evaluation else "training")
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        with torch.set_grad_enabled(not evaluation):
            out = net(x)
            recorder.register_tensor("out", out)
            loss = ((out - y) ** 2).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            if evaluation:  # under no_grad autograd shows no edge, so say them
                recorder.add_tensor_connection("x", "out")
                recorder.add_tensor_connection("out", "loss")
            else:
                optimizer.zero_grad()
                loss.backward()
                recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        if not evaluation:
            optimizer.step()
    watch.remove()
    recorder.finalize()
    return scan(directory / "group")


def _dropout_findings(findings: list) -> list:
    return [f for f in serious(findings) if f.evidence.get("problem") in (
        "functional_dropout_in_evaluation", "dropout_train_in_evaluation")]


@pytest.mark.parametrize("variant", ["default_training", "training_true"])
def test_functional_dropout_on_evaluation_steps_is_an_error_on_its_module(tmp_path: Path, variant: str) -> None:
    found = _dropout_findings(record(tmp_path, variant))
    assert [(f.detector, f.severity, f.node) for f in found] == [("run_modes", "error", "net.1")], found
    evidence = found[0].evidence
    assert evidence["problem"] == "functional_dropout_in_evaluation" and evidence["input"] == "net.1.fc"
    assert evidence["nodes"] == ["net.1"]
    assert 0.25 <= evidence["zero_fraction"] <= 0.55  # p = 0.4, estimated from the recorded values
    assert 0.25 <= evidence["training_zero_fraction"] <= 0.55  # on in training too
    assert found[0].steps == [3, 7, 11, 15, 19, 23]  # every evaluation step
    assert "training=self.training" in found[0].message


@pytest.mark.parametrize("variant", ["fixed", "module", "relu", "sparse", "masked", "shrink", "pooled"])
def test_healthy_zeros_give_no_dropout_finding(tmp_path: Path, variant: str) -> None:
    findings = record(tmp_path, variant)
    assert _dropout_findings(findings) == [], [f.message for f in _dropout_findings(findings)]
    assert [f.message for f in serious(findings, ("run_modes",))] == []


def test_a_dropout_module_left_in_training_mode_is_one_finding_not_two(tmp_path: Path) -> None:
    found = _dropout_findings(record(tmp_path, "module_left_on"))
    assert [(f.evidence["problem"], f.node) for f in found] == [("dropout_train_in_evaluation", "net.1.dropout")], [
        f.message for f in found]
