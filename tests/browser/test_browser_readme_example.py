"""The README's one-line example, run exactly as written (a CNN whose labels do not belong to its images, so
that its loss stays at chance), then opened in the app: a warning about the loss, the Start here strip that
leads to it, the loss curve in the Graphs tab with the values the store holds, and nodes named with their type."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

pytest.importorskip("torch")
from comgra.analysis import Scanner  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
expect.set_options(timeout=30_000)  # a loaded 2-core machine

CURVES = """el => Array.from(el.querySelectorAll('.js-plotly-plot')).flatMap(
  plot => plot._fullData.map(t => [t.name || '', Array.from(t.x), Array.from(t.y)]))"""


def readme_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"## One line in your training.*?```python\n(.*?)```", readme, flags=re.S)
    assert match, "the README's one-line example"
    return match.group(1)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("readme-example")
    (folder / "example.py").write_text(readme_snippet())
    done = subprocess.run([sys.executable, "-W", "error", "example.py"], cwd=folder, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    group = folder / "runs" / "my_group"
    assert (group / "trials" / "trial_1").is_dir()
    return group


def test_the_readmes_example_finds_the_stuck_loss_and_shows_it(serve, browser: Any, recorded: Path) -> None:
    from comgra.server.start_here import guide_finding

    findings = Scanner().scan(recorded).findings
    # The loss that stays at chance (log 10, the logits' width) over all 200 steps, while the optimizer moved the
    # parameters well past its step size: a warning, first, and the finding the Start here strip leads from.
    stuck = [f for f in findings if f.node == "loss" and f.detector == "loss_stuck"]
    assert stuck and stuck[0].severity == "warning" and findings[0] is stuck[0], findings[:3]
    guide = guide_finding(findings)
    assert guide is not None and (guide.node, guide.detector) == ("loss", "loss_stuck")
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    url = serve(recorded)
    page.goto(url)
    # The Start here strip, in view, leads to the stuck loss: step 1 opens it first in the Findings tab.
    strip = page.locator(".start-here-box")
    expect(strip).to_be_in_viewport()
    expect(strip).to_contain_text("loss_stuck (warning)")
    strip.get_by_role("link", name="The finding").click()
    first = page.locator("#findings-list .finding").first
    expect(first).to_be_in_viewport()
    assert (first.get_attribute("data-node"), first.get_attribute("data-detector")) == ("loss", "loss_stuck")
    page.goto(url)
    # The graph: module outputs named with their type; the input, output and loss in their roles.
    expect(page.locator('[data-node="model.1"] .node-name')).to_have_text("model.1 (ReLU)")
    expect(page.locator('[data-node="model.0"] .node-name')).to_have_text("model.0 (Conv2d)")
    for node, role in (("model.input", "input"), ("model", "output"), ("loss", "loss")):
        expect(page.locator(f'[data-node="{node}"]')).to_have_attribute("aria-label", re.compile(role, re.I))
    # The Graphs tab: the loss curve, every step, as the store has it.
    page.goto(url + "?tab=graphs")
    figures = page.locator("#kpi-graphs")
    expect(figures.locator(".js-plotly-plot").first).to_be_visible()
    page.wait_for_function("el => el.querySelector('.js-plotly-plot') && el.querySelector('.js-plotly-plot')._fullData",
                           arg=figures.element_handle())
    curves = figures.evaluate(CURVES)
    loss = [c for c in curves if "loss" in c[0]]
    assert loss, curves
    kpis = GroupReader(recorded).trial("trial_1").kpis().to_pylist()
    stored = sorted((k["timepoint"], k["value"]) for k in kpis if k["kpi_group"] == "loss")
    assert len(stored) == 200  # every step of the example
    _, xs, ys = loss[0]
    assert list(xs) == [t for t, _ in stored] and ys == pytest.approx([v for _, v in stored], rel=1e-6)
    context.close()
    assert errors == []
