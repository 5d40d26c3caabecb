"""The Findings tab: a click on a finding opens the Tensors view on the selection it names, with the store's numbers."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))
from planted import Network, mlp, record  # noqa: E402

from comgra.analysis import Scanner, saved  # noqa: E402


@pytest.fixture(scope="module")
def dead_recording(tmp_path_factory):
    blocks = mlp(4, 16, 1, activation=torch.nn.ReLU)
    with torch.no_grad():
        blocks[0][1][0].bias.fill_(-20.0)
    return record(tmp_path_factory.mktemp("findings"), "dead", Network(blocks, steps=8))


def test_a_click_on_a_finding_shows_the_selection_it_names(serve, open_page, dead_recording) -> None:
    (finding,) = [f for f in Scanner().scan(dead_recording).findings if f.detector == "dead_units"]
    page = open_page(serve(dead_recording), dead_recording)
    page.page.get_by_role("tab", name="Findings").click(no_wait_after=True)
    expect(page.page.locator("#panel-findings")).to_be_visible(timeout=20_000)
    item = page.page.locator('#findings-list .finding[data-detector="dead_units"]')
    expect(item).to_contain_text(finding.message, timeout=20_000)
    expect(page.page.locator('.finding[data-severity="info"]').first).to_be_visible()
    # Filter by severity: only the warning is left.
    page.page.locator("#findings-severity").get_by_text("info").click()
    page.page.wait_for_timeout(4000)  # under load the list re-renders more than once after a filter change
    expect(page.page.locator("#findings-list .finding")).to_have_count(1, timeout=20_000)
    item.get_by_role("button", name="Details").click()
    detail = item.locator(".findings-detail")  # below the finding itself
    expect(detail.locator(".finding-series")).to_be_visible()
    expect(detail).to_contain_text("dead_fraction: 1\n")
    item.get_by_role("link", name="Open in Tensors").click()
    page.page.wait_for_selector("#stat-mean")
    page.wait_for(node="layer0", training_step=finding.training_step, kind="forward")
    shown = page.check_against_store()
    assert (shown["node_id"], shown["role"], shown["aggregation"], int(shown["iteration"])) == \
        (finding.node, finding.role, finding.aggregation, finding.iteration)
    assert "tab=findings" not in page.page.url


def test_badges_appear_on_the_graph_once_a_slow_scan_is_done(serve, open_page, dead_recording, monkeypatch,
                                                             tmp_path) -> None:
    """The graph is drawn at once, without waiting for the scan; the badge comes when the scan is done,
    with no click and no change of trial (before, it came only if the scan took under 0.25 s)."""
    import threading

    from comgra.analysis import scan

    release = threading.Event()
    original = scan.detect_all
    monkeypatch.setattr(scan, "detect_all", lambda data, options: release.wait(60) and original(data, options))
    recording = _never_scanned(dead_recording, tmp_path)
    page = open_page(serve(recording, warm_up=False), recording)
    node = page.page.locator('.graph-node[data-node="layer0"]')
    expect(node).to_be_visible(timeout=20_000)
    page.page.wait_for_timeout(1500)
    expect(node.locator(".node-badge")).to_have_count(0)
    release.set()
    expect(node.locator('.node-badge[data-badge="1 \u26a0"]')).to_be_visible(timeout=20_000)


def _never_scanned(group: Path, tmp_path: Path) -> Path:
    """A copy of the group folder without the findings an earlier test's app saved in it."""
    copy = tmp_path / group.name
    shutil.copytree(group, copy, ignore=shutil.ignore_patterns(saved.FOLDER))
    return copy


def test_a_scanned_recording_opens_its_findings_at_once(serve, open_page, dead_recording, monkeypatch,
                                                       tmp_path) -> None:
    """``comgra scan`` (or an earlier app) saved the findings in the recording: a new app lists all of them
    and badges the graph without scanning anything."""
    from comgra.analysis import scan

    recording = _never_scanned(dead_recording, tmp_path)
    expected = Scanner(persist=True).scan(recording).findings  # what comgra scan leaves in the recording
    scanned: list[str] = []
    monkeypatch.setattr(scan, "detect_all", lambda data, options: scanned.append(data.trial) or ([], []))
    page = open_page(serve(recording, warm_up=False), recording)
    expect(page.page.locator('.graph-node[data-node="layer0"] .node-badge[data-badge="1 \u26a0"]')).to_be_visible()
    page.page.get_by_role("tab", name="Findings").click(no_wait_after=True)
    expect(page.page.locator("#findings-list .finding")).to_have_count(len(expected), timeout=20_000)
    expect(page.page.locator("#findings-count")).to_have_text(f"{len(expected)} findings")
    shown = page.page.locator("#findings-list .finding .finding-message").all_inner_texts()
    assert shown == [f.message for f in expected] and scanned == []
