"""Dark mode is readable, and so is light mode: on every tab, in both colour schemes, every visible text
(labels, controls, Dash's dropdowns and sliders, tables, the Plotly figures' SVG text) meets WCAG AA against the
background it is drawn on (4.5:1; 3:1 for large text), computed from the browser's computed styles."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
from contrast import low_contrast  # noqa: E402

from comgra.examples.tutorial import run_tutorial  # noqa: E402
from comgra.server.ids import TABS  # noqa: E402


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_tutorial(tmp_path_factory.mktemp("contrast"), steps=300, min_training_steps_difference=50,
                        hidden_size=32, progress=False)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_tab_meets_wcag_aa_contrast(serve, browser: Any, tutorial: Path, scheme: str) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=scheme)
    page = context.new_page()
    page.set_default_timeout(60_000)
    url = serve(tutorial)
    page.goto(url)
    page.wait_for_selector(".start-here-box")  # the strip too: the background scan found the bug
    page.wait_for_selector("#series-plot .js-plotly-plot .main-svg")
    assert page.evaluate("document.documentElement.getAttribute('data-bs-theme')") == scheme
    background = page.evaluate("getComputedStyle(document.querySelector('#series-plot .main-svg')).backgroundColor")
    assert (background == "rgb(31, 35, 39)") == (scheme == "dark"), background  # the figures follow the scheme
    failures = {"tensors": low_contrast(page)}
    page.locator(".selector-trial .dash-dropdown").first.click()  # an open dropdown's options
    page.wait_for_timeout(500)
    failures["tensors, the trial dropdown open"] = low_contrast(page)
    for tab in TABS[1:]:
        page.goto(f"{url}?tab={tab}")
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(2500)  # the tab's callbacks draw
        failures[tab] = low_contrast(page)
    context.close()
    assert {tab: found for tab, found in failures.items() if found} == {}


def test_the_start_here_strip_stays_on_the_findings_tab_and_the_console_stays_clean(serve, browser: Any,
                                                                                     tutorial: Path) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(60_000)
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: console.append(str(error)))
    page.goto(serve(tutorial))
    page.wait_for_selector(".start-here-box")
    page.wait_for_timeout(1500)
    assert console == []  # no "ID not found in layout" on load
    page.locator('.start-here-step[data-step="1"] a').click()
    page.wait_for_selector("#findings-list .finding")
    page.wait_for_selector(".start-here-box")  # step 1 opened Findings: steps 2 and 3 are still there
    page.locator('.start-here-step[data-step="2"] a').click()
    page.wait_for_selector("#dependency-graph .graph-node.selected")
    page.locator(".start-here-close").click()
    page.wait_for_selector(".start-here-box", state="detached")
    context.close()
    assert console == []
