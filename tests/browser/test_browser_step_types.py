"""The step slider in Chromium when an evaluation shares a training step's number (the Trainer's global_step):
a position for each step (number, type), each showing its own values, as the store holds them."""
from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

torch = pytest.importorskip("torch")

STEPS = [(0, "training"), (1, "evaluation"), (1, "training"), (2, "evaluation"), (2, "training")]


def _record(root: Path) -> Path:
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsHardcoded({0, 1, 2}),
                              flush_seconds=0.05)
    recorder.track_module("net", model)
    for position, (step, kind) in enumerate(STEPS):
        recorder.start_batch(step, 4, type_of_execution=kind)
        recorder.start_iteration()
        x = torch.full((4, 3), float(position + 1))
        recorder.register_tensor("x", x, is_input=True)
        loss = model(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        if kind == "training":
            loss.backward()
            recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    return root / "group"


def test_the_step_slider_has_a_position_for_each_step_of_a_shared_number(tmp_path, serve, open_page) -> None:
    group = _record(tmp_path / "store")
    app = open_page(serve(group), group)
    app.click_node("x")
    app.choose("aggregation-select", "Mean over the batch")
    app.wait_for(node="x", training_step=0, type_of_execution="training")
    app.check_against_store()
    slider = app.page.locator("#step-slider [role=slider]")
    for position, (step, kind) in enumerate(STEPS[1:], start=2):
        app.page.focus("#step-slider [role=slider]")
        app.page.keyboard.press("ArrowRight")
        app.wait_for(training_step=step, type_of_execution=kind)
        expect(app.page.locator("#step-info")).to_contain_text(f"{kind} · {position} of {len(STEPS)}")
        shown = app.check_against_store()
        assert float(shown["stats"]["mean"][0]) == pytest.approx(float(position))  # x = position, all values
    expect(slider).to_have_attribute("aria-valuemax", str(len(STEPS) - 1))
    app.page.click("#step-prev")  # back from (2, training) to (2, evaluation): the number alone would not move
    app.wait_for(training_step=2, type_of_execution="evaluation")
    app.check_against_store()
    assert not app.errors
