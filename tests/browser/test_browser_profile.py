"""The Profile and Resources tabs in Chromium, checked against the store's rows (read with pyarrow)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from comgra.store import layout
from playwright.sync_api import expect

sys.path.insert(0, str(Path(__file__).parents[1] / "api"))
from profiled_recording import TRIAL, record  # noqa: E402

SLOW = 20_000  # ms: on a busy machine a tab's first answer can wait behind the Tensors tab's callbacks
READ_TABLE = """() => Array.from(document.querySelectorAll('table.slowest-layers tbody tr')).map(tr =>
  Array.from(tr.querySelectorAll('td')).map(td => td.textContent))"""


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    return record(tmp_path_factory.mktemp("browser-profile") / "store", steps=4, resource_seconds=0.05)


def _store_rows(recording: Path, table: str) -> list[dict[str, Any]]:
    return ds.dataset(str(layout.trial_partition(recording, table, TRIAL)), format="parquet", partitioning="hive").to_table().to_pylist()


def test_the_profile_tab_shows_the_stores_layers(serve: Any, open_page: Any, recording: Path) -> None:
    app = open_page(serve(recording), recording)
    app.page.get_by_role("tab", name="Profile").click()
    expect(app.page.locator("table.slowest-layers tbody tr").first).to_be_visible(timeout=SLOW)
    # The table against the layers chunks, summed here without comgra's code.
    totals: dict[str, list[float]] = {}
    for row in _store_rows(recording, "layers"):
        totals.setdefault(row["module"], []).append(row["forward_time"])
    expected = sorted(totals, key=lambda m: -sum(totals[m]))
    shown = app.page.evaluate(READ_TABLE)
    assert [r[0] for r in shown] == expected
    for module, total, calls, mean, low, high in shown:
        values = totals[module]
        assert float(total) == pytest.approx(sum(values), abs=1e-4)
        assert int(calls) == len(values)
        assert float(low) == pytest.approx(min(values) * 1e3, abs=1e-3)
        assert float(high) == pytest.approx(max(values) * 1e3, abs=1e-3)
    # The flame graph: one bar per module, nested (plotly's icicle keeps ids and parents in its data).
    flame = app.page.locator("#profile-flame .js-plotly-plot")
    expect(flame).to_be_visible(timeout=SLOW)
    trace = app.page.evaluate("() => document.querySelector('#profile-flame .js-plotly-plot').data[0]")
    assert trace["type"] == "icicle" and sorted(trace["ids"]) == sorted(totals)
    assert dict(zip(trace["ids"], trace["parents"]))["net.b1.a"] == "net.b1"
    # Each view links to the API call that returns its data; the trace downloads as Chrome trace JSON.
    link = app.page.locator("#profile-links a.api-link").first.get_attribute("href")
    assert link == f"/api/v1/trials/{TRIAL}/flamegraph?phase=forward"
    nodes = app.page.request.get(app.page.url.split("/?")[0].rstrip("/") + link).json()["nodes"]
    assert sorted(n["name"] for n in nodes) == sorted(totals)
    download = app.page.locator("a.trace-download")
    with app.page.expect_download() as info:
        download.click()
    events = json.loads(Path(info.value.path()).read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(_store_rows(recording, "layers"))
    # Backward: the same table for the other phase.
    app.page.get_by_text("backward", exact=True).click()
    expect(app.page.locator("#profile-links a.api-link").first).to_have_attribute(
        "href", f"/api/v1/trials/{TRIAL}/flamegraph?phase=backward", timeout=SLOW)
    assert not app.errors


def test_the_resources_tab_plots_the_stored_samples(serve: Any, open_page: Any, recording: Path) -> None:
    app = open_page(serve(recording), recording)
    app.page.get_by_role("tab", name="Resources").click()
    expect(app.page.locator(".resource-plot .js-plotly-plot").first).to_be_visible(timeout=SLOW)
    samples = [r for r in _store_rows(recording, "resources")
               if r["source"] == "process" and r["metric"] == "memory_bytes"]
    traces = app.page.evaluate("""() => Array.from(document.querySelectorAll('.resource-plot .js-plotly-plot'))
        .flatMap(p => p.data.map(t => ({name: t.name, y: t.y, unit: (p.layout.yaxis.ticksuffix || "").trim()})))""")
    shown = next(t for t in traces if t["name"] == "Training process: memory in use")  # not "process memory_bytes"
    size = 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(shown["unit"])  # bytes are shown in binary units
    assert sorted(v * size for v in shown["y"]) == pytest.approx(sorted(r["value"] for r in samples), rel=1e-12)
    status = app.page.locator("#resources-status")
    gpu = json.loads((recording / "trials" / TRIAL / "resources-r000.json").read_text())["gpu_status"]
    from comgra.server.profile_panel import gpu_sentence

    expect(status).to_have_text(gpu_sentence(gpu))
    assert "NVMLError" not in status.inner_text()  # the exception's text only on hover
    if gpu.startswith("no GPU"):
        assert not any(t["name"].startswith("gpu") for t in traces)
    href = app.page.locator("#resources-links a.api-link").get_attribute("href")
    assert href == f"/api/v1/trials/{TRIAL}/resources"
    assert not app.errors
