"""Findings saved in the recording (``analysis/findings-*.json``): the same answer as a fresh scan, stale on
new chunks or new code, ignored when damaged, skipped on a read-only recording, and read by the app at once."""
from __future__ import annotations

import json
import os
import shutil
import stat

import pytest

torch = pytest.importorskip("torch")

from planted import record_dead_and_healthy  # noqa: E402

from comgra.analysis import ScanOptions, Scanner, document, saved, scan  # noqa: E402
from comgra.analysis import loading  # noqa: E402
from comgra.cli.app import main  # noqa: E402
from comgra.service import RecordingService  # noqa: E402
from comgra.store import format as fmt  # noqa: E402
from comgra.store import layout


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from comgra.store import writer

    writer.COMPACT_AT_CLOSE = False  # a chunk per flush, as a run that is still going has: the tests hold one back
    try:
        return record_dead_and_healthy(tmp_path_factory.mktemp("saved"))
    finally:
        writer.COMPACT_AT_CLOSE = True


@pytest.fixture
def group(recorded, tmp_path):
    """A fresh copy: every test starts from a recording that was never scanned."""
    copy = tmp_path / "group"
    shutil.copytree(recorded, copy)
    return copy


@pytest.fixture
def chunk_reads(monkeypatch):
    """The tensors chunks read, by name."""
    read: list[str] = []
    original = loading.read_chunk
    monkeypatch.setattr(loading, "read_chunk", lambda trial, path: read.append(path.name) or original(trial, path))
    return read


def _json(findings) -> str:
    """What a user sees of findings: the ``comgra scan --json`` document (NaN compares equal as text)."""
    return json.dumps(document(findings), sort_keys=True)


def _saved_files(group) -> list:
    return sorted(group.glob(f"trials/*/{saved.FOLDER}/*.json"))


def test_saved_findings_are_exactly_a_fresh_scans_and_nothing_is_scanned_again(group, counted_scans) -> None:
    fresh = Scanner().scan(group)  # persist=False: the Python API writes nothing behind the caller's back
    assert _saved_files(group) == [] and sorted(counted_scans) == ["dead", "healthy"]
    first = Scanner(persist=True).scan(group)
    assert len(_saved_files(group)) == 2
    counted_scans.clear()
    again = Scanner(persist=True).scan(group)  # another process, as it were
    assert counted_scans == []
    assert _json(again.findings) == _json(first.findings) == _json(fresh.findings)
    assert again.findings == first.findings  # the same objects too (a fresh scan is normalized as saved)
    assert any(f.detector == "dead_units" for f in again.findings)


def test_the_store_globs_never_see_the_saved_findings(group) -> None:
    Scanner(persist=True).scan(group)
    for table in (*fmt.TABLES, "graphs"):
        assert not [p for p in group.glob(f"trials/*/{table}/*") if saved.FOLDER in p.parts]
    assert {p.parent.name for p in _saved_files(group)} == {saved.FOLDER}


def test_a_new_chunk_makes_the_saved_findings_stale_and_only_it_is_read(group, counted_scans, chunk_reads) -> None:
    trial = fmt.trial_dir(group, "dead")
    tensors, steps = sorted((layout.rank_dir(trial, "tensors", 0)).glob("*.parquet")), sorted((layout.rank_dir(trial, "steps", 0)).glob("*.parquet"))
    assert len(tensors) > 1 and len(steps) > 1
    held_back = group.parent / "held_back"
    held_back.mkdir()
    for path in (tensors[-1], steps[-1]):  # the run's last flush has not happened yet
        shutil.move(path, held_back / f"{layout.table_of_chunk(path)}-{path.name}")
    scanner = Scanner(persist=True)
    before = scanner.scan(group, trials=["dead"])
    assert len(chunk_reads) == len(tensors) - 1
    for path in (tensors[-1], steps[-1]):  # now it has (tensors first, as the writer does)
        shutil.move(held_back / f"{layout.table_of_chunk(path)}-{path.name}", path)
    chunk_reads.clear()
    counted_scans.clear()
    after = scanner.scan(group, trials=["dead"])
    assert chunk_reads == [tensors[-1].name] and counted_scans == ["dead"]  # incremental: the new chunk alone is read
    assert max(after.findings[0].steps) > max(before.findings[0].steps)  # the new steps are in the answer
    assert _json(after.findings) == _json(Scanner().scan(group, trials=["dead"]).findings)
    saved_now = json.loads(_saved_files(group)[0].read_text())
    assert tensors[-1].name in saved_now["signature"]  # the saved file was rewritten for the new data
    counted_scans.clear()
    assert _json(Scanner(persist=True).scan(group, trials=["dead"]).findings) == _json(after.findings)
    assert counted_scans == []


@pytest.mark.parametrize("damage", [
    b"", b"{not json", b"[1, 2]", b'{"findings": [{"detector": 1}]}', b"\xff\xfe\x00",
])
def test_damaged_saved_findings_are_ignored_and_written_again(group, counted_scans, damage) -> None:
    expected = _json(Scanner(persist=True).scan(group).findings)
    for path in _saved_files(group):
        path.write_bytes(damage)
    counted_scans.clear()
    assert _json(Scanner(persist=True).scan(group).findings) == expected
    assert sorted(counted_scans) == ["dead", "healthy"]
    assert all(json.loads(p.read_text())["fingerprint"] == saved.fingerprint(ScanOptions()) for p in _saved_files(group))


def test_a_damaged_finding_inside_a_valid_file_is_ignored(group, counted_scans) -> None:
    expected = _json(Scanner(persist=True).scan(group).findings)
    path = _saved_files(group)[0]
    content = json.loads(path.read_text())
    content["findings"] = [{"detector": "x"}]  # the right version and chunks, a finding without its fields
    path.write_text(json.dumps(content))
    counted_scans.clear()
    assert _json(Scanner(persist=True).scan(group).findings) == expected and len(counted_scans) == 1


def test_new_analysis_code_or_other_options_scan_again(group, counted_scans, monkeypatch) -> None:
    Scanner(persist=True).scan(group)
    counted_scans.clear()
    Scanner(persist=True).scan(group, options=ScanOptions(sensitivity=2.0))  # its own file
    assert sorted(counted_scans) == ["dead", "healthy"] and len(_saved_files(group)) == 4
    counted_scans.clear()
    current = saved.environment()
    monkeypatch.setattr(saved, "environment", lambda: {**current, "sources": "a-newer-detector"})
    Scanner(persist=True).scan(group)
    assert sorted(counted_scans) == ["dead", "healthy"]


@pytest.fixture
def fresh_environment():
    """``saved.environment`` is computed once per process: computed again for each test, and after it."""
    saved.environment.cache_clear()
    yield
    saved.environment.cache_clear()


def _scanned_again(group, counted_scans, options=None) -> list[str]:
    counted_scans.clear()
    Scanner(persist=True).scan(group, options=options)
    return sorted(counted_scans)


@pytest.mark.parametrize("library", ["scikit-learn", "scipy", "numpy", "pandas"])
def test_a_new_version_of_a_library_the_detectors_use_makes_saved_findings_stale(
        group, counted_scans, monkeypatch, fresh_environment, library) -> None:
    Scanner(persist=True).scan(group)
    assert _scanned_again(group, counted_scans) == []  # unchanged: answered from the saved files
    installed = saved._installed_version
    monkeypatch.setattr(saved, "_installed_version", lambda name: installed(name) + ".post1" if name == library
                        else installed(name))
    saved.environment.cache_clear()
    assert _scanned_again(group, counted_scans) == ["dead", "healthy"]
    document = json.loads(_saved_files(group)[0].read_text())
    assert document["fingerprint"][library] == installed(library) + ".post1"  # rewritten with the new one
    assert _scanned_again(group, counted_scans) == []


@pytest.mark.parametrize("source", ["store/reader.py", "store/format.py", "analysis/units.py"])
def test_a_change_in_the_chunk_reader_or_a_detector_makes_saved_findings_stale(
        group, counted_scans, monkeypatch, tmp_path, fresh_environment, source) -> None:
    watched = saved.watched_sources()
    original = next(p for p in watched if p.as_posix().endswith(source))
    copy = tmp_path / "edited" / original.name  # stands in for the installed file, same name and bytes
    copy.parent.mkdir()
    shutil.copy(original, copy)
    monkeypatch.setattr(saved, "watched_sources", lambda: [copy if p == original else p for p in watched])
    saved.environment.cache_clear()
    Scanner(persist=True).scan(group)
    saved.environment.cache_clear()
    assert _scanned_again(group, counted_scans) == []  # the same bytes: the same fingerprint
    copy.write_text(copy.read_text() + "\n# edited\n")
    saved.environment.cache_clear()
    assert _scanned_again(group, counted_scans) == ["dead", "healthy"]


def test_other_thresholds_or_a_new_comgra_make_saved_findings_stale(group, counted_scans, monkeypatch) -> None:
    Scanner(persist=True).scan(group)
    assert _scanned_again(group, counted_scans, ScanOptions(dead_fraction=0.3)) == ["dead", "healthy"]
    assert _scanned_again(group, counted_scans, ScanOptions(dead_fraction=0.3)) == []
    # A file at the right name whose options differ (written by hand, or by a scan that hashed them otherwise).
    path = saved.path_of(fmt.trial_dir(group, "dead"), ScanOptions(dead_fraction=0.3))
    document = json.loads(path.read_text())
    document["fingerprint"]["options"]["dead_fraction"] = 0.9
    path.write_text(json.dumps(document))
    assert _scanned_again(group, counted_scans, ScanOptions(dead_fraction=0.3)) == ["dead"]
    assert saved.stale_parts(document["fingerprint"], ScanOptions(dead_fraction=0.3)) == ["options"]
    current = saved.environment()
    monkeypatch.setattr(saved, "environment", lambda: {**current, "comgra": "9.9"})
    assert _scanned_again(group, counted_scans) == ["dead", "healthy"]


def test_a_read_only_recording_is_scanned_and_nothing_is_written(group, counted_scans, monkeypatch) -> None:
    expected = _json(Scanner().scan(group).findings)
    for folder in [group, *group.rglob("*")]:
        if folder.is_dir():
            folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    if os.geteuid() == 0:  # root writes anyway: make the write fail as it would for anyone else
        def refuse(path, content):
            raise PermissionError(13, "Permission denied", str(path))
        monkeypatch.setattr(fmt, "write_json_atomic", refuse)
    try:
        counted_scans.clear()
        assert _json(Scanner(persist=True).scan(group).findings) == expected
        assert _json(Scanner(persist=True).scan(group).findings) == expected
        assert len(counted_scans) == 4  # scanned each time: nothing could be kept
        assert _saved_files(group) == []
    finally:
        for folder in [group, *group.rglob("*")]:
            if folder.is_dir():
                folder.chmod(0o755)


def test_the_app_takes_saved_findings_at_once_without_loading_the_detectors(group, monkeypatch) -> None:
    assert main(["scan", "--path", str(group), "--json"]) == 0  # comgra scan saves what it found
    expected = _json(Scanner().scan(group).findings)
    monkeypatch.setattr(scan, "detect_all", lambda data, options: pytest.fail("scanned again"))
    service = RecordingService(group)
    try:
        progress = service.findings_progress(wait_seconds=0.0)  # the tab's first question, not waiting
        assert progress.pending == [] and _json(progress.findings) == expected
        assert service.finding_badges("dead") == {"layer0": "1 \u26a0"}
        assert service.finding_questions._findings_worker()._scanner is None  # the detectors were never loaded
    finally:
        service.close()


def test_the_apps_scan_is_saved_for_the_next_start(group, counted_scans) -> None:
    service = RecordingService(group)
    try:
        found = service.findings()
    finally:
        service.close()
    assert len(_saved_files(group)) == 2
    counted_scans.clear()
    service = RecordingService(group)
    try:
        assert _json(service.findings_progress().findings) == _json(found) and counted_scans == []
    finally:
        service.close()


def test_findings_saved_at_older_data_are_shown_until_the_new_scan_is_done(group, monkeypatch) -> None:
    import threading

    Scanner(persist=True).scan(group)
    tensors = layout.rank_dir(fmt.trial_dir(group, "dead"), "tensors", 0)
    new_chunk = tensors / fmt.chunk_name(999, 1000, 1000)  # the run went on after the scan
    shutil.copy(sorted(tensors.glob("*.parquet"))[0], new_chunk)
    release = threading.Event()
    original = scan.detect_all
    monkeypatch.setattr(scan, "detect_all", lambda data, options: release.wait(60) and original(data, options))
    service = RecordingService(group)
    try:
        progress = service.findings_progress()
        assert progress.pending == ["dead"]  # being scanned again; meanwhile its last findings are listed
        assert any(f.trial == "dead" and f.detector == "dead_units" for f in progress.findings)
        assert service.finding_badges("dead") == {"layer0": "1 \u26a0"}
        release.set()
        assert service.findings_progress(wait_seconds=60).pending == []
    finally:
        release.set()
        service.close()
    assert new_chunk.name in json.loads(_saved_files(group)[0].read_text())["signature"]


def test_a_trial_deleted_while_it_was_scanned_is_not_brought_back(group) -> None:
    from comgra.analysis.findings import trial_signature
    from comgra.store import GroupReader

    trial = GroupReader(group).trial("dead")
    signature = trial_signature(trial)
    shutil.rmtree(trial.directory)
    assert not saved.save(trial, signature, ScanOptions(), [], [])
    assert not trial.directory.exists()
