"""``comgra demo`` as a user runs it, then its Profile tab in Chromium: the demo profiles the tutorial's layers,
so the tab draws a flame graph, one bar per profiled module of the store (issue 33 item 12: it was empty)."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from comgra_page import ComgraPage
from playwright.sync_api import expect

from comgra.server.profile_panel import ALL_MODULES
from comgra.store import layout

TRIAL = "trial_bugged_original_version"
SLOW = 30_000


def _layer_rows(group: Path, trial: str) -> list[dict]:
    partition = layout.trial_partition(group, "layers", trial)
    return ds.dataset(str(partition), format="parquet", partitioning="hive").to_table().to_pylist()


def test_the_demos_profile_tab_draws_the_stores_flame_graph(browser, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    root = tmp_path / "rec"
    process = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "demo", "--steps", "16", "--path", str(root),
                                "--port", "0", "--no-token"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    context = None
    try:
        url = next(m.group(1).rstrip("/") for line in process.stdout  # type: ignore[union-attr]
                   if (m := re.search(r"open (http://[^\s?]+)", line)))
        deadline = time.monotonic() + 900
        while not any("recording done" in line for line in errors) and time.monotonic() < deadline:
            assert process.poll() is None, "".join(errors)
            time.sleep(1)
        assert any("recording done" in line for line in errors), "".join(errors)
        group = root / "demo"
        modules = {row["module"] for row in _layer_rows(group, TRIAL)}
        assert {"main_model.subnet_pre", "main_model.subnet_out"} <= modules  # the demo recorded a profile

        context = browser.new_context(viewport={"width": 1280, "height": 800})
        app = ComgraPage(context.new_page(), group)
        app.page.set_default_timeout(SLOW)
        app.load(f"{url}/?tab=profile&trial={TRIAL}", ready="#tabs")
        flame = app.page.locator("#profile-flame .js-plotly-plot")
        expect(flame).to_be_visible(timeout=SLOW)
        trace = app.page.evaluate("() => document.querySelector('#profile-flame .js-plotly-plot').data[0]")
        # One bar per profiled module, under the band of the modules profiled side by side (the tutorial's subnets).
        assert trace["type"] == "icicle" and sorted(trace["ids"]) == sorted(modules | {ALL_MODULES})
        parents = dict(zip(trace["ids"], trace["parents"]))
        assert parents["main_model.subnet_pre"] == ALL_MODULES
        assert parents["main_model.subnet_pre.layer_in"] == "main_model.subnet_pre"
        expect(app.page.locator("table.slowest-layers tbody tr").first).to_be_visible()
        assert not app.errors
    finally:
        if context is not None:
            context.close()
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(10)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
