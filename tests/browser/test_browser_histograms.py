"""TensorBoard's Histograms view below the series plot, in Chromium at 1280x800: a heatmap per trial whose counts are
np.histogram's of the stored values pooled over the samples, computed here from the tensors chunks (pyarrow), on
bins shared by the trials."""
from __future__ import annotations

import numpy as np
import pyarrow.dataset as ds
import pytest
from comgra_page import ComgraPage
from comgra.store import layout
from playwright.sync_api import expect

SLOW = 30_000
HEATMAPS = """() => document.querySelector('#distribution-plot .js-plotly-plot').data
  .map(t => ({type: t.type, name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || []), z: t.z}))"""

# The pixel position of every step's row on the drawn step axis (plotly's own data-to-pixel map).
ROWS = """() => { const gd = document.querySelector('#distribution-plot .js-plotly-plot');
  const axis = gd._fullLayout.yaxis;
  return {length: axis._length, range: axis.range, rows: axis.categoryarray.map(c => axis.c2p(axis.d2c(c)))}; }"""


def pooled_values(recording, trial, row, steps_of_type):
    rows = ds.dataset(str(layout.trial_partition(recording, "tensors", trial)), format="parquet", partitioning="hive").to_table().to_pylist()
    steps = ds.dataset(str(layout.trial_partition(recording, "steps", trial)), format="parquet", partitioning="hive").to_table().to_pylist()
    wanted = {r["training_step"] for r in steps if steps_of_type in (None, r["type_of_execution"])}
    pooled: dict[int, list[float]] = {}
    for r in rows:
        if r["training_step"] in wanted and r["aggregation"] == "sample" and all(
                r[k] == row[k] for k in ("node", "role", "kind", "iteration")):
            pooled.setdefault(r["training_step"], []).extend(r["neurons"])
    return {step: np.asarray(values, dtype=np.float64) for step, values in pooled.items()}


def test_the_histograms_are_the_stored_values_of_both_trials_on_shared_bins(browser, serve, recording):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        app = ComgraPage(context.new_page(), recording)
        app.load(serve(recording))
        app.click_node("output")
        shown = app.read()
        row = app.expected_row(shown)
        kind = app.page.evaluate("() => new URLSearchParams(location.search).get('type')")
        kind = None if kind in (None, "", "__any__") else kind
        trials = sorted(t.name for t in (recording / "trials").iterdir())
        expected = {t: pooled_values(recording, t, row, kind) for t in trials}
        assert all(len(series) >= 10 for series in expected.values())
        app.page.get_by_text("Histograms (a row per step)").click()
        app.page.locator("#distribution-plot").scroll_into_view_if_needed()  # drawn only in view (issue 34)
        app.page.wait_for_function("() => { const p = document.querySelector('#distribution-plot .js-plotly-plot');"
                                   " return p && p.data.length && p.data.every(t => t.type === 'heatmap'); }",
                                   timeout=SLOW)
        expect(app.page.locator("#distribution-plot .js-plotly-plot")).to_be_in_viewport()
        drawn = {t["name"]: t for t in app.page.evaluate(HEATMAPS)}
        assert sorted(drawn) == trials
        # The bins: equal ones from the smallest stored value of both trials to the largest, as many as drawn.
        centres = np.asarray(drawn[trials[0]]["x"])
        everything = np.concatenate([v for series in expected.values() for v in series.values()])
        edges = np.linspace(everything.min(), everything.max(), len(centres) + 1)
        assert centres == pytest.approx((edges[:-1] + edges[1:]) / 2)
        for trial, series in expected.items():
            assert drawn[trial]["x"] == pytest.approx(centres.tolist())
            assert drawn[trial]["y"] == [str(s) for s in sorted(series)]
            assert drawn[trial]["z"] == [np.histogram(series[s], bins=edges)[0].tolist() for s in sorted(series)]
        # Equal row heights whatever the steps' spacing: the pixel rows of the drawn steps are evenly spaced.
        drawn_axis = app.page.evaluate(ROWS)
        rows, gaps = drawn_axis["rows"], np.diff(drawn_axis["rows"])
        assert len(rows) >= 10 and gaps.max() - gaps.min() < 0.05, drawn_axis
        assert abs(gaps.mean()) == pytest.approx(drawn_axis["length"] / len(rows), rel=0.01), drawn_axis
        assert not app.errors
    finally:
        context.close()
