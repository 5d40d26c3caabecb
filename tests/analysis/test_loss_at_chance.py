"""A loss at chance (log of the classes the logits' width gives) over a whole run: a warning once the optimizer has
moved the parameters well past its step size and the loss never left its band; no warning on a healthy run that sits
at chance for its first few hundred steps and then learns, nor on a live run that is still early."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn

import comgra
from comgra.analysis import Scanner
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader


def _cnn_on_unrelated_labels(root: Path, trial: str, steps: int, every: int, *, finalize: bool = True) -> ComgraRecorder:
    """The README's one-line example: a CNN whose labels do not belong to its images, recorded through watch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    recorder = ComgraRecorder(root, "group", trial, DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=every))
    watch = comgra.watch(model, recorder=recorder)
    try:
        for step in range(steps):
            images, labels = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))
            recorder.start_batch(step, 32)
            recorder.start_iteration()
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            recorder.record_current_gradients("gradients")
            optimizer.step()
            recorder.finish_iteration()
            recorder.finish_batch()
    finally:
        watch.remove()
    if finalize:
        recorder.finalize()
    return recorder


def _loss_findings(group: Path, trial: str) -> list:
    return [f for f in Scanner().scan(group, trials=[trial]).findings if f.node == "loss"]


def test_a_loss_at_chance_over_a_whole_run_is_a_warning(tmp_path: Path) -> None:
    _cnn_on_unrelated_labels(tmp_path, "stuck", 200, 5)
    found = _loss_findings(tmp_path / "group", "stuck")
    assert found and found[0].detector == "loss_stuck" and found[0].severity == "warning", found
    evidence = found[0].evidence
    assert evidence["classes"] == 10 and evidence["chance"] == pytest.approx(math.log(10))
    assert evidence["moved_steps"] >= 25
    # The numbers in the message are the store's: every recorded loss within the band of log(10).
    kpis = GroupReader(tmp_path / "group").trial("stuck").kpis().to_pylist()
    losses = [k["value"] for k in kpis if k["kpi_group"] == "loss"]
    assert len(losses) == 200 and all(abs(v - math.log(10)) < 0.25 for v in losses)
    assert "40 recorded training steps" in found[0].message


def test_a_live_run_still_early_gets_no_warning(tmp_path: Path) -> None:
    """Read while it records (flushed, not finalized): 30 steps at chance are too few to tell from a plateau."""
    recorder = _cnn_on_unrelated_labels(tmp_path, "early", 30, 1, finalize=False)
    try:
        recorder.flush()
        found = _loss_findings(tmp_path / "group", "early")
        assert found and all(f.severity == "info" for f in found), found  # named, but no warning yet
        stuck = [f for f in found if f.detector == "loss_stuck"]
        assert all("too early" in f.message and f.evidence["moved_steps"] < 25 for f in stuck), stuck
    finally:
        recorder.finalize()


def test_a_plateau_at_chance_before_the_loss_falls_is_no_warning(tmp_path: Path) -> None:
    """A tanh MLP started near its saddle (weights scaled down) under SGD: at chance for its first ~300 steps,
    then it learns. Over the whole run the loss leaves its band: no finding about being at chance."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(10, 16, generator=generator) * 1.5
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
    with torch.no_grad():
        for layer in model[::2]:
            layer.weight.mul_(0.05)
            layer.bias.zero_()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = ComgraRecorder(tmp_path, "group", "plateau", DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=10))
    watch = comgra.watch(model, recorder=recorder)
    first = []
    try:
        for step in range(600):
            y = torch.randint(0, 10, (32,), generator=generator)
            x = centres[y] + 0.5 * torch.randn(32, 16, generator=generator)
            recorder.start_batch(step, 32)
            recorder.start_iteration()
            loss = nn.functional.cross_entropy(model(x), y)
            first.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            recorder.record_current_gradients("gradients")
            optimizer.step()
            recorder.finish_iteration()
            recorder.finish_batch()
    finally:
        watch.remove()
    recorder.finalize()
    assert max(abs(v - math.log(10)) for v in first[:250]) < 0.05 * math.log(10)  # the plateau is real
    assert sum(first[-20:]) / 20 < 1.0  # and so is the fall
    findings = Scanner().scan(tmp_path / "group").findings
    assert not [f for f in findings if f.detector == "loss_stuck"], findings
    assert not [f for f in findings if f.node == "loss" and f.severity in ("warning", "error")], findings
