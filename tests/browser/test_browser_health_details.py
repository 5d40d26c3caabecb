"""The Health tab's details (issue 33, item 10), in Chromium: the heatmap's cells without a colour have a legend and
say on hover why; the findings' messages are cut at a word with an ellipsis, the whole message on hover."""
from __future__ import annotations

from pathlib import Path

import pytest
from comgra_page import ComgraPage
from playwright.sync_api import expect

torch = pytest.importorskip("torch")
from comgra.service import RecordingService  # noqa: E402

SLOW = 30_000
expect.set_options(timeout=SLOW)  # a loaded 2-core machine
CELLS = """() => { const p = document.querySelector('#health-gradients .js-plotly-plot');
  const t = p._fullData[0]; return {layers: Array.from(t.y), steps: Array.from(t.x),
  z: Array.from(t.z, row => Array.from(row)), text: Array.from(t.text, row => Array.from(row)),
  background: p._fullLayout.plot_bgcolor}; }"""


@pytest.fixture(scope="module")
def branchy(tmp_path_factory) -> Path:
    """A layer used only on even steps: on odd steps its gradient is not recorded (cells without a colour)."""
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    root = tmp_path_factory.mktemp("health-details")
    torch.manual_seed(0)
    first, second = torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)
    sometimes = torch.nn.Linear(4, 4)
    with torch.no_grad():
        first.bias[:2] = -100.0  # dead ReLUs
    parameters = [*first.parameters(), *second.parameters(), *sometimes.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=0.001)
    recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsHardcoded(set(range(6))))
    for name, module in (("first", first), ("second", second), ("sometimes", sometimes)):
        recorder.track_module(name, module)
    for step in range(6):
        recorder.start_batch(step, 4)
        recorder.start_iteration()
        x = torch.randn(4, 3)
        recorder.register_tensor("x", x, is_input=True)
        hidden = torch.relu(first(x))
        recorder.register_tensor("hidden", hidden)  # two of its units are dead: findings
        recorder.add_tensor_connection("x", "hidden")
        if step % 2 == 0:
            hidden = sometimes(hidden)
        out = second(hidden)
        recorder.register_tensor("out", out)
        loss = (out - 10.0).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        optimizer.step()
    recorder.finalize()
    return root / "group"


@pytest.fixture
def open_health(browser, serve, branchy):
    contexts = []

    def open_() -> ComgraPage:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        contexts.append(context)
        app = ComgraPage(context.new_page(), branchy)
        app.page.set_default_timeout(SLOW)  # a loaded 2-core machine
        app.load(serve(branchy), ready="#tabs")
        return app

    yield open_
    for context in contexts:
        context.close()


def test_cells_without_colour_have_a_legend_and_a_reason_on_hover(open_health) -> None:
    app = open_health()
    app.page.get_by_role("tab", name="Health").click()
    expect(app.page.locator("#health-gradients .heatmaplayer")).to_have_count(1, timeout=SLOW)
    drawn = app.page.evaluate(CELLS)
    missing = [(layer, step) for layer, row, texts in zip(drawn["layers"], drawn["z"], drawn["text"])
               for step, value, text in zip(drawn["steps"], row, texts) if value is None]
    assert missing, "the layer used on even steps only has no gradient on odd steps"
    assert all(step in ("1", "3", "5") for _, step in missing) and all("sometimes" in layer for layer, _ in missing)
    texts = {(layer, step): text for layer, texts in zip(drawn["layers"], drawn["text"])
             for step, text in zip(drawn["steps"], texts)}
    assert all(texts[cell] == "not recorded" for cell in missing)
    legend = app.page.locator(".health-missing-legend")
    expect(legend).to_contain_text("not recorded")
    swatch = legend.locator(".missing-swatch").evaluate("e => e.style.backgroundColor || e.style.background")
    assert swatch == "rgb(189, 189, 189)" and drawn["background"].upper() in ("#BDBDBD", "RGB(189, 189, 189)")
    assert not app.errors


def test_finding_messages_are_cut_with_an_ellipsis_and_whole_on_hover(open_health, branchy) -> None:
    health = RecordingService(branchy).training_health("trial", wait_seconds=60)
    assert health.findings_by_node, "the dead units give findings"
    app = open_health()
    app.page.get_by_role("tab", name="Health").click()
    cells = app.page.locator(".health-findings tbody tr td:last-child span")
    expect(cells).to_have_count(len(health.findings_by_node), timeout=SLOW)
    for index, finding in enumerate(health.findings_by_node):
        cell = cells.nth(index)
        shown, whole = cell.inner_text(), cell.get_attribute("title")
        assert whole == finding["top"]
        if len(whole) > 160:
            assert shown.endswith("…") and len(shown) <= 160
            kept = shown[:-1]
            assert whole.startswith(kept) and whole[len(kept)] in " ,;:."  # cut between words, never inside one
        else:
            assert shown == whole
    assert not app.errors
