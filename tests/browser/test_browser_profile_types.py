"""The Profile tab over evaluations that share training steps' numbers: one type at a time, the numbers against the
store's layers rows of that type (read with pyarrow, not comgra's reader)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from comgra.store import layout
from playwright.sync_api import expect

sys.path.insert(0, str(Path(__file__).parents[1] / "profiling"))
from test_profiling_step_types import EVALUATED_AT, STEPS, _record  # noqa: E402

SLOW = 20_000  # ms
READ_TABLE = """() => Array.from(document.querySelectorAll('table.slowest-layers tbody tr')).map(tr =>
  Array.from(tr.querySelectorAll('td')).map(td => td.textContent))"""


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    return _record(tmp_path_factory.mktemp("browser-profile-types"))


def _calls(recording: Path, kind: str) -> dict[str, int]:
    rows = ds.dataset(str(layout.trial_partition(recording, "layers", "trial")), format="parquet",
                      partitioning="hive").to_table().to_pylist()
    counts: dict[str, int] = {}
    for row in rows:
        if row["type_of_execution"] == kind:
            counts[row["module"]] = counts.get(row["module"], 0) + 1
    return counts


def _shown_calls(page: Any) -> dict[str, int]:
    return {row[0]: int(row[2]) for row in page.evaluate(READ_TABLE)}


def test_the_profile_tab_shows_one_type_of_execution_at_a_time(serve: Any, open_page: Any, recording: Path) -> None:
    app = open_page(serve(recording), recording)
    app.page.get_by_role("tab", name="Profile").click()
    expect(app.page.locator("table.slowest-layers tbody tr").first).to_be_visible(timeout=SLOW)
    chooser = app.page.locator("#profile-execution")
    expect(chooser).to_be_visible(timeout=SLOW)
    assert chooser.locator("label").all_text_contents() == [" training ", " evaluation "]
    training = _calls(recording, "training")
    assert training["net.0"] == STEPS and _shown_calls(app.page) == training
    chooser.get_by_text("evaluation").click()
    evaluation = _calls(recording, "evaluation")
    assert evaluation["net.0"] == len(EVALUATED_AT)
    expect(app.page.locator("table.slowest-layers tbody tr").first.locator("td").nth(2)).to_have_text(
        str(len(EVALUATED_AT)), timeout=SLOW)
    assert _shown_calls(app.page) == evaluation
    link = app.page.locator("#profile-links a.api-link").first.get_attribute("href")
    assert "execution=evaluation" in link
