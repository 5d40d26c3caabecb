"""The Images tab (TensorBoard's Images), in Chromium: a registered input of shape (N, 1, 28, 28) and one of
(N, 3, 8, 8) are drawn per sample and recorded step, each pixel the value the store holds for it; an image too large
for what was recorded says which setting records it."""
from __future__ import annotations

import base64

import numpy as np
import pytest
from comgra_page import ComgraPage
from playwright.sync_api import expect

from comgra.store import GroupReader

SLOW = 30_000
GROUP = "group"
TRIAL = "images"
STEPS = (0, 3, 6)
BATCH = 4
CELLS = """() => Array.from(document.querySelectorAll('#images-grid img')).map(
  i => ({sample: +i.dataset.sample, step: +i.dataset.step, src: i.getAttribute('src'), width: i.naturalWidth}))"""


def record(root):
    torch = pytest.importorskip("torch")
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    recorder = ComgraRecorder(root, GROUP, TRIAL, DecisionMakerForRecordingsHardcoded(set(STEPS)), flush_seconds=0.05)
    conv = torch.nn.Conv2d(1, 3, 3, padding=1)
    recorder.track_module("conv", conv)
    generator = torch.Generator().manual_seed(0)
    for step in range(7):
        recorder.start_batch(step, BATCH)
        recorder.start_iteration()
        digits = torch.rand(BATCH, 1, 28, 28, generator=generator)  # 784 values a sample: more than the 256 kept by default
        digits[:, :, :, :4] = 0.0  # a dark band on the left of every image
        recorder.register_tensor("digits", digits, is_input=True)
        colour = torch.sigmoid(conv(torch.nn.functional.avg_pool2d(digits, 3, stride=3)[:, :, :8, :8]))
        recorder.register_tensor("colour", colour)  # (N, 3, 8, 8)
        big = torch.rand(BATCH, 3, 80, 80, generator=generator)  # 19,200 values: not kept whole by default
        recorder.register_tensor("big", big)
        recorder.add_tensor_connection("digits", "colour")
        loss = colour.mean() + big.mean() * 0
        recorder.register_tensor("loss", loss, is_loss=True, index_of_batch_dimension=None)
        recorder.add_tensor_connection("colour", "loss")
        loss.backward()
        recorder.record_current_gradients("loss")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()


def decode(src):
    from _plotly_utils.png import Reader

    assert src.startswith("data:image/png;base64,")
    width, height, rows, info = Reader(bytes=base64.b64decode(src.split(",", 1)[1])).read()
    return np.array([list(row) for row in rows], dtype=np.float64).reshape(height, width, info["planes"])


def test_images_per_sample_across_steps_are_the_recorded_values(browser, serve, tmp_path):
    record(tmp_path)
    trial = GroupReader(tmp_path / GROUP).trial(TRIAL)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    app = ComgraPage(context.new_page(), tmp_path / GROUP)
    app.page.set_default_timeout(SLOW)  # a loaded 2-core machine
    try:
        app.load(serve(tmp_path / GROUP), ready="#tabs")
        app.page.get_by_role("tab", name="Images").click()
        expect(app.page.locator("#images-grid img")).to_have_count(BATCH * len(STEPS), timeout=SLOW)
        expect(app.page.locator("#images-caption")).to_contain_text("Black is 0, white 1")
        cells = app.page.evaluate(CELLS)
        assert {(c["sample"], c["step"]) for c in cells} == {(s, t) for s in range(BATCH) for t in STEPS}
        for cell in cells:
            stored = trial.selection(training_step=cell["step"], node="digits", aggregation="sample",
                                     sample=cell["sample"], kind="forward").to_pylist()
            values = np.asarray(stored[0]["neurons"], dtype=np.float64).reshape(28, 28, 1)
            assert cell["width"] == 28
            assert np.abs(decode(cell["src"]) - np.rint(values * 255)).max() <= 1
        assert decode(cells[0]["src"])[:, :4].max() == 0  # the dark band is where it was

        app.page.click("#images-tensor")
        app.page.locator(".dash-dropdown-option, .VirtualizedSelectOption", has_text="colour").first.click()
        expect(app.page.locator("#images-caption")).to_contain_text("colour (3×8×8)", timeout=SLOW)
        cells = app.page.evaluate(CELLS)
        assert len(cells) == BATCH * len(STEPS)
        stored = trial.selection(training_step=cells[-1]["step"], node="colour", aggregation="sample",
                                 sample=cells[-1]["sample"], kind="forward").to_pylist()
        rgb = np.asarray(stored[0]["neurons"], dtype=np.float64).reshape(3, 8, 8).transpose(1, 2, 0)
        assert np.abs(decode(cells[-1]["src"]) - np.rint(rgb * 255)).max() <= 1  # channels as red, green, blue

        app.page.click("#images-tensor")
        app.page.locator(".dash-dropdown-option, .VirtualizedSelectOption", has_text="big").first.click()
        expect(app.page.locator("#images-caption")).to_contain_text("max_num_neurons_to_record=19200", timeout=SLOW)
        expect(app.page.locator("#images-grid img")).to_have_count(0)
        assert not app.errors
    finally:
        context.close()
