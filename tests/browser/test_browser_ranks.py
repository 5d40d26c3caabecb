"""The rank selector in Chromium: shown only for a multi-rank trial; one rank's values, or all ranks' lines."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect

GOLDEN_V2 = Path(__file__).resolve().parents[1] / "golden" / "format_v2" / "golden_group"


def _stat(app, name: str) -> float:
    return float(app.page.locator(f"#stat-{name}").get_attribute("data-value"))


@pytest.fixture
def two_ranks(tmp_path, serve, open_page):
    group = tmp_path / "golden_group"
    shutil.copytree(GOLDEN_V2, group)
    return open_page(serve(group), group)


def test_the_rank_selector_switches_values_and_draws_a_line_per_rank(two_ranks):
    app = two_ranks
    expect(app.page.locator("#rank-selector")).to_be_visible()
    app.wait_for(node="x", aggregation="Mean over the batch")
    assert _stat(app, "mean") == 2.5  # rank 0: x = arange(6) at step 0
    app.choose("rank-select", "Rank 1")
    expect(app.page.locator("#stat-mean")).to_have_attribute("data-value", "1002.5")
    lines = app.page.locator("#series-plot .scatterlayer .trace")
    expect(lines).to_have_count(1)
    app.choose("rank-select", "All ranks")
    expect(lines).to_have_count(2)
    legend = app.page.locator("#series-plot .legendtext")
    assert legend.all_text_contents() == ["golden_trial · rank 0", "golden_trial · rank 1"]
    assert not app.errors


def test_a_single_process_recording_has_no_rank_selector(serve, open_page, recording):
    app = open_page(serve(recording), recording)
    expect(app.page.locator("#rank-selector")).to_be_hidden()
