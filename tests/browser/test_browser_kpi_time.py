"""The Graphs tab's x-axis switch (TensorBoard's step, wall time and relative time), in Chromium: the x of every point
drawn is the time the recorder wrote for it; in a recording made before the KPI table kept times, the switch's two
time axes are off and the page says why."""
from __future__ import annotations

import csv
import datetime as dt
import io
import time
from pathlib import Path

import pytest
from comgra_page import ComgraPage
from playwright.sync_api import expect

from comgra.store import GroupReader

SLOW = 30_000
GROUP = "group"
PLOT = "#kpi-graphs .js-plotly-plot"
DRAWN = """() => { const p = document.querySelector('#kpi-graphs .js-plotly-plot');
  return {type: p._fullLayout.xaxis.type, title: p._fullLayout.xaxis.title.text,
          curves: p._fullData.filter(t => t.showlegend !== false).map(t => ({name: t.name, x: Array.from(t.x)}))}; }"""


def open_graphs(browser, url, recording):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    app = ComgraPage(context.new_page(), recording)
    app.page.set_default_timeout(SLOW)  # a loaded 2-core machine
    app.load(url, ready="#tabs")
    app.page.get_by_role("tab", name="Graphs").click()
    expect(app.page.locator(PLOT).first).to_be_attached(timeout=SLOW)
    return context, app


def drawn_after(app, axis_type):
    app.page.wait_for_function(f"() => {{ const p = document.querySelector('{PLOT}');"
                               f" return p && p._fullLayout.xaxis.type === '{axis_type}'; }}", timeout=SLOW)
    return app.page.evaluate(DRAWN)


def test_the_kpi_x_axis_switches_between_step_wall_time_and_relative_time(browser, serve, tmp_path):
    pytest.importorskip("torch")
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    recorder = ComgraRecorder(tmp_path, GROUP, "timed", DecisionMakerForRecordingsHardcoded({0}), flush_seconds=0.05)
    for step in range(6):
        recorder.start_batch(step, 1)
        recorder.record_kpi_in_graph("loss", "train", 1.0 / (step + 1), record_even_if_recording_is_inactive=True)
        recorder.finish_batch()
        time.sleep(0.3 if step != 2 else 1.5)  # uneven gaps: the time axes are not the steps rescaled
    recorder.finalize()
    stored = GroupReader(tmp_path / GROUP).trial("timed").kpis().to_pylist()
    times = [row["wall_time"] for row in stored]
    assert [row["timepoint"] for row in stored] == list(range(6)) and None not in times

    context, app = open_graphs(browser, serve(tmp_path / GROUP), tmp_path / GROUP)
    try:
        radios = app.page.locator("#kpi-x-axis input")
        expect(radios).to_have_count(3)
        for index in range(3):
            expect(radios.nth(index)).to_be_enabled()
        by_step = app.page.evaluate(DRAWN)
        assert by_step["title"] == "training step" and by_step["curves"][0]["x"] == list(range(6))

        app.page.get_by_label("wall time").check()
        wall = drawn_after(app, "date")
        assert wall["title"] == "wall time"
        drawn = [dt.datetime.fromisoformat(x).replace(tzinfo=dt.timezone.utc).timestamp() for x in wall["curves"][0]["x"]]
        assert drawn == pytest.approx(times, abs=0.002)  # milliseconds on a date axis

        app.page.get_by_label("relative").check()
        relative = drawn_after(app, "linear")
        assert relative["title"] == "seconds since the trial's first KPI point"
        assert relative["curves"][0]["x"] == pytest.approx([t - times[0] for t in times], abs=1e-6)
        assert relative["curves"][0]["x"][3] - relative["curves"][0]["x"][2] > 1.4  # the long gap is drawn
        expect(app.page.locator("#kpi-x-note")).to_have_text("")
        assert not app.errors
    finally:
        context.close()


def test_the_time_axes_are_off_and_say_why_for_a_recording_without_kpi_times(browser, serve, recording):
    trial = GroupReader(recording).trials()[0]
    assert GroupReader(recording).trial(trial).kpis()["wall_time"].null_count > 0  # written as older comgra did
    context, app = open_graphs(browser, serve(recording), recording)
    try:
        radios = app.page.locator("#kpi-x-axis input")
        expect(radios.nth(1)).to_be_disabled(timeout=SLOW)
        expect(radios.nth(2)).to_be_disabled()
        expect(radios.nth(0)).to_be_checked()
        expect(app.page.locator("#kpi-x-note")).to_contain_text("have no recorded time")
        expect(app.page.locator("#kpi-x-note")).to_contain_text(repr(trial))
        assert app.page.evaluate(DRAWN)["type"] == "linear"
        assert not app.errors
    finally:
        context.close()


def test_the_graphs_csv_has_the_stores_wall_time(browser, serve, tmp_path):
    """The Graphs tab's Download CSV as a user saves it: its wall_time column holds the recorder's time of each
    KPI point (seconds since the epoch, as TensorBoard's CSV), exactly as stored, row by row."""
    pytest.importorskip("torch")
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    recorder = ComgraRecorder(tmp_path, GROUP, "timed", DecisionMakerForRecordingsHardcoded({0}), flush_seconds=0.05)
    for step in range(5):
        recorder.start_batch(step, 1)
        recorder.record_kpi_in_graph("loss", "train", 1.0 / (step + 1), record_even_if_recording_is_inactive=True)
        recorder.record_kpi_in_graph("accuracy", "train", step / 10, record_even_if_recording_is_inactive=True)
        recorder.finish_batch()
        time.sleep(0.2 if step != 1 else 1.1)
    recorder.finalize()
    stored = GroupReader(tmp_path / GROUP).trial("timed").kpis().to_pylist()
    assert len(stored) == 10 and None not in [row["wall_time"] for row in stored]

    context, app = open_graphs(browser, serve(tmp_path / GROUP), tmp_path / GROUP)
    try:
        with app.page.expect_download() as download:
            app.page.click("#kpi-csv")
        rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
        assert "wall_time" in rows[0]
        saved = sorted((r["kpi_name"], int(r["training_step"]), float(r["value"]), float(r["wall_time"])) for r in rows)
        assert saved == sorted((k["kpi_name"], k["timepoint"], k["value"], k["wall_time"]) for k in stored)  # exact
        gaps = sorted(float(r["wall_time"]) for r in rows if r["kpi_group"] == "loss")
        assert gaps[2] - gaps[1] > 1.0  # the long pause is in the times, not the steps rescaled
        assert not app.errors
    finally:
        context.close()


def test_the_graphs_csv_has_no_wall_time_for_a_recording_without_kpi_times(browser, serve, recording):
    trial = GroupReader(recording).trials()[0]
    assert GroupReader(recording).trial(trial).kpis()["wall_time"].null_count > 0  # written as older comgra did
    context, app = open_graphs(browser, serve(recording), recording)
    try:
        with app.page.expect_download() as download:
            app.page.click("#kpi-csv")
        header = Path(download.value.path()).read_text().splitlines()[0].split(",")
        assert header == ["trial", "kpi_group", "kpi_name", "type_of_execution", "training_step", "value"]
        assert not app.errors
    finally:
        context.close()
