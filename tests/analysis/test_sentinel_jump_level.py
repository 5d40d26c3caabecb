"""A transient scale jump (``sentinel_events``, problem ``transient_jump``) must rise above every level the tensor
held in the run. A classifier that learns its task drives the loss to about 1e-7; one later batch with a sample
closer to another class brings it back to 1e-3 for a step: orders above the steps around it, but far below where the
loss started, so no false alarm. A batch of unnormalised inputs (100x) on one step sends the logits above any
level they held: that one is found, on its step."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from evidence_runs import scan, serious  # noqa: E402
from torch import nn  # noqa: E402

from comgra.objects import DecisionMakerForRecordingsFrequencyPerType  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402

STEPS, SPIKE = 100, 87  # 1 step in 10 recorded: 87 is not


def _record(directory: Path, variant: str) -> tuple[list, list[float]]:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(3)
    centres = torch.randn(4, 8, generator=generator) * 3
    model = nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))
    recorder = ComgraRecorder(directory, "group", variant, DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=10))
    recorder.track_module("model", model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(STEPS):
        y = torch.randint(0, 4, (32,), generator=generator)
        x = centres[y] + 0.3 * torch.randn(32, 8, generator=generator)
        if step == SPIKE:
            if variant == "border_sample":  # one sample a third of the way to another class's centre
                x[0] = 0.65 * centres[y[0]] + 0.35 * centres[(y[0] + 1) % 4]
            else:  # "unnormalised": a batch that skipped its normalisation (100x)
                x = x * 100
        recorder.start_batch(step, 32)
        recorder.start_iteration()
        recorder.register_tensor("input", x, is_input=True)
        output = model(x)
        recorder.register_tensor("output", output)
        loss = nn.functional.cross_entropy(output, y)
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        recorder.record_current_gradients("gradients")
        optimizer.step()
        recorder.finish_iteration()
        recorder.finish_batch()
        losses.append(float(loss.detach()))
    recorder.finalize()
    return scan(directory / "group"), losses


def _jumps(findings: list) -> list:
    return [f for f in serious(findings) if f.evidence.get("problem") == "transient_jump"]


def test_a_converged_loss_back_at_a_small_value_for_one_step_is_no_jump(tmp_path: Path) -> None:
    findings, losses = _record(tmp_path, "border_sample")
    before, after = sorted(losses[SPIKE - 6:SPIKE])[3], sorted(losses[SPIKE + 1:SPIKE + 7])[3]
    assert losses[SPIKE] > 100 * max(before, after), losses[SPIKE - 6:SPIKE + 7]  # the planted blip: 2 orders up
    assert losses[SPIKE] < losses[0] / 100  # and far below where the loss started
    assert _jumps(findings) == [], [f.message for f in _jumps(findings)]


def test_logits_above_any_level_they_held_for_one_step_are_a_jump(tmp_path: Path) -> None:
    findings, _ = _record(tmp_path, "unnormalised")
    found = _jumps(findings)
    assert [(f.node, f.training_step) for f in found] == [("output", SPIKE)], [f.message for f in found]
