"""The Health tab in Chromium: the gradient heatmap, the sentinel events and the findings by node are drawn, and a
click on a heatmap cell leads to that layer's gradient in the Tensors view, with the store's numbers."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from playwright.sync_api import expect

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def health_recording(tmp_path_factory) -> Path:
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder

    root = tmp_path_factory.mktemp("health")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=3))
    recorder.track_module("net", net)
    for step in range(10):
        x = torch.randn(4, 3)
        if step == 7:
            x[0, 0] = math.nan
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
        recorder.finish_iteration()
        recorder.finish_batch()
        if step < 7:
            optimizer.step()
    recorder.finalize()
    return root / "group"


def test_the_health_tab_links_a_gradient_cell_to_its_selection(serve, open_page, health_recording, tmp_path) -> None:
    page = open_page(serve(health_recording), health_recording)
    page.page.get_by_role("tab", name="Health").click(no_wait_after=True)
    expect(page.page.locator("#panel-health")).to_be_visible(timeout=20_000)
    heatmap = page.page.locator("#health-gradients")
    expect(heatmap.locator(".heatmaplayer")).to_have_count(1, timeout=20_000)
    events = page.page.locator(".health-events")
    expect(events).to_contain_text("nan", timeout=20_000)
    expect(events).to_contain_text("not recorded")
    expect(page.page.locator(".health-findings")).to_contain_text("out", timeout=30_000)
    page.page.screenshot(path=str(tmp_path / "health.png"), full_page=True)
    # The first layer's cell at the second recorded step (step 3): the grid is 2 layers x 4 steps.
    # The cell's centre from plotly's own axes, measured just before the click (the page above the heatmap may
    # still change size while the findings arrive, which moved a position measured earlier onto another cell).
    def cell_centre() -> tuple[float, float]:
        return tuple(page.page.evaluate("""() => {
            const plot = document.querySelector('#health-gradients .js-plotly-plot');
            const box = plot.getBoundingClientRect(), x = plot._fullLayout.xaxis, y = plot._fullLayout.yaxis;
            return [box.left + x._offset + x.l2p(1), box.top + y._offset + y.l2p(0)];
        }"""))
    page.page.mouse.move(*cell_centre())  # hover, then click: as a user
    page.page.wait_for_timeout(300)
    page.page.mouse.click(*cell_centre())
    link = page.page.locator("#health-cell a")
    expect(link).to_contain_text("net.0", timeout=20_000)
    href = link.get_attribute("href")
    assert href is not None and "step=3" in href and "kind=gradients" in href
    link.click()
    page.page.wait_for_selector("#stat-mean")
    page.wait_for(node="net.0.weight")
    shown = page.check_against_store()
    assert (shown["training_step"], shown["kind"]) == ("3", "gradients")
