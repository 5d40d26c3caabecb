"""The Breakpoints tab against a real training process: add, see it pause, follow the paused step, continue."""
from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from comgra.breakpoints import control

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "breakpoints"))
from live_processes import STARTED as _STARTED  # noqa: E402  (the same training script and launcher)
from live_processes import start_training as _start  # noqa: E402

expect = pytest.importorskip("playwright.sync_api").expect


def _wait_for(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_breakpoints_tab_controls_a_run_in_progress(tmp_path: Path, serve: Any, browser: Any) -> None:
    process, trial_dir, out = _start(tmp_path)
    try:
        _wait_for(lambda: control.run_state(trial_dir)["state"] == "running", "the run to start")
        url = serve(tmp_path / "root" / "group", poll_seconds=1)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.goto(url + "/?tab=breakpoints&trial=trial")
        expect(page.locator("#bp-run-state [data-state]")).to_have_text("running", timeout=20000)

        # A bad condition is refused with the name of the bad token; nothing is added.
        page.fill("#bp-target", "loss")
        page.fill("#bp-condition", "los > 1")
        page.click("#bp-add")
        expect(page.locator("#bp-message")).to_contain_text("unknown name 'los'", timeout=20000)
        assert control.list_breakpoints(trial_dir) == []

        page.fill("#bp-condition", "step == 2")
        page.click("#bp-add")
        row = page.locator('.bp-list tr[data-id="bp1"]')
        expect(row).to_contain_text("step == 2", timeout=20000)
        assert [(b["target"], b["condition"]) for b in control.list_breakpoints(trial_dir)] == [("loss", "step == 2")]

        (out / "go").touch()
        expect(page.locator("#bp-run-state [data-state]")).to_have_text("paused", timeout=60000)
        expect(row.locator(".bp-hits")).to_have_text("1", timeout=20000)
        link = page.locator(".bp-paused-link")
        href = link.get_attribute("href")
        assert href is not None and "step=2" in href and "trial=trial" in href
        assert "node=loss" in href  # the link selects the breakpoint's target
        for button in ("#bp-continue", "#bp-step", "#bp-abort"):
            expect(page.locator(button)).to_be_enabled()
        assert control.run_state(trial_dir)["training_step"] == 2

        # With the 1-s poll stopped, an action still shows its result: the callback that performs it
        # renders the panel, and a continued run reads as running as soon as the command is answered.
        in_flight: set[Any] = set()
        page.on("request", lambda request: in_flight.add(request))
        page.on("requestfinished", lambda request: in_flight.discard(request))
        page.on("requestfailed", lambda request: in_flight.discard(request))
        # The app's own poll of the recording is stopped too: a new chunk of the paused step changes the
        # data version, which re-sets the current trial, and that refreshes this panel as a poll would.
        page.evaluate("window.dash_clientside.set_props('bp-poll', {disabled: true})")
        page.evaluate("window.dash_clientside.set_props('poll', {disabled: true})")
        page.wait_for_timeout(200)  # a tick due right now is sent, and seen, before the polls stop
        # A poll sent just before the stop would otherwise list what comes next.
        # (page.wait_for_timeout, not time.sleep: Playwright delivers its events only inside its own calls.)
        _wait_for(lambda: page.wait_for_timeout(50) or not in_flight, "the last poll to be answered")
        control.add_breakpoint(trial_dir, "hidden", "has_nan")  # made elsewhere: not shown without the poll
        page.wait_for_timeout(2500)
        expect(page.locator('.bp-list tr[data-id="bp2"]')).to_have_count(0)
        row.get_by_role("button", name="Disable").click()
        expect(row.locator(".bp-enabled")).to_have_text("off", timeout=20000)
        expect(page.locator('.bp-list tr[data-id="bp2"]')).to_have_count(1)  # the action rendered the whole panel
        assert control.list_breakpoints(trial_dir)[0]["enabled"] is False
        page.click("#bp-continue")
        expect(page.locator("#bp-message")).to_have_text("Sent continue.", timeout=20000)
        expect(page.locator("#bp-run-state [data-state]")).to_have_text(re.compile("running|finished"))

        page.evaluate("window.dash_clientside.set_props('bp-poll', {disabled: false})")  # the run's own changes
        page.evaluate("window.dash_clientside.set_props('poll', {disabled: false})")
        expect(page.locator("#bp-run-state [data-state]")).to_have_text("finished", timeout=60000)
        for button in ("#bp-continue", "#bp-step", "#bp-abort"):  # nothing to continue on a finished run
            expect(page.locator(button)).to_be_disabled()
        # A target the recording does not hold is refused, with the closest name (the tab, not the training's stderr).
        page.fill("#bp-target", "los")
        page.fill("#bp-condition", "has_nan")
        page.click("#bp-add")
        expect(page.locator("#bp-message")).to_contain_text("did you mean 'loss'?", timeout=20000)
        assert "los" not in [b["target"] for b in control.list_breakpoints(trial_dir)]
        _, errors = process.communicate(timeout=60)
        assert process.returncode == 0, errors[-2000:]
        assert len(json.loads((out / "losses-r000.json").read_text())) > 2

        # The link opens the paused step in the Tensors view, which the run recorded in full.
        page.goto(url + href)
        page.wait_for_selector("#stat-mean")
        page.wait_for_function("() => new URLSearchParams(location.search).get('step') === '2'")
        page.wait_for_function("() => new URLSearchParams(location.search).get('node') === 'loss'")
        context.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        if process in _STARTED:
            _STARTED.remove(process)
