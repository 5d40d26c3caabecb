"""``comgra scan``: the JSON document, the table, bad input (exit 2, one line), damaged chunks, live runs."""
from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")

from planted import Network, mlp, record, record_dead_and_healthy  # noqa: E402

from comgra.analysis import ScanOptions, Scanner  # noqa: E402
from comgra.cli.app import main  # noqa: E402
from comgra.store import format as fmt  # noqa: E402

FINDING_FIELDS = {"detector", "severity", "score", "trial", "node", "role", "kind", "training_step", "steps",
                  "iteration", "message", "evidence", "selection", "link"}


@pytest.fixture(scope="module")
def dead_group(tmp_path_factory):
    return record_dead_and_healthy(tmp_path_factory.mktemp("scan"))


def test_json_document_is_versioned_and_each_finding_links_to_its_selection(dead_group, capsys) -> None:
    assert main(["scan", "--path", str(dead_group), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["format_version"] == 1 and document["skipped_chunks"] == []
    findings = document["findings"]
    assert findings and all(FINDING_FIELDS <= set(f) for f in findings)
    dead = next(f for f in findings if f["detector"] == "dead_units")
    assert findings.index(dead) == 0  # the only warning ranks first
    assert dead["selection"] == {"trial": "dead", "training_step": 0, "iteration": 0, "node_id": "layer0",
                                 "role": "layer0", "kind": "forward", "aggregation": "abs_max"}
    assert dead["link"] == ("/?tab=tensors&trial=dead&step=0&iteration=0&node=layer0&role=layer0&kind=forward"
                            "&aggregation=abs_max")
    severities = [f["severity"] for f in findings]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)


def test_table_and_trial_filter(dead_group, capsys) -> None:
    assert main(["scan", "--path", str(dead_group), "--trial", "dead"]) == 0
    out = capsys.readouterr().out
    assert "dead_units" in out and "layer0" in out and "healthy" not in out


@pytest.mark.parametrize("arguments, named", [
    (["--trial", "nope"], "'nope'"),
    (["--target", "nope"], "'nope'"),
])
def test_bad_trial_or_target_is_one_line_and_exit_2(dead_group, capsys, arguments, named) -> None:
    assert main(["scan", "--path", str(dead_group), *arguments]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and named in error and "Known:" in error


def test_path_without_recording_is_exit_2(tmp_path, capsys) -> None:
    assert main(["scan", "--path", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_newer_format_is_exit_2_naming_the_version(dead_group, tmp_path, capsys) -> None:
    group = tmp_path / "group"
    shutil.copytree(dead_group, group)
    meta = fmt.trial_dir(group, "dead") / fmt.TRIAL_META
    document = json.loads(meta.read_text())
    document["format_version"] = fmt.FORMAT_VERSION + 1
    meta.write_text(json.dumps(document))
    assert main(["scan", "--path", str(group), "--trial", "dead"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and str(fmt.FORMAT_VERSION + 1) in error


def test_damaged_chunk_is_skipped_and_listed_while_the_rest_is_scanned(dead_group, tmp_path, capsys) -> None:
    group = tmp_path / "group"
    shutil.copytree(dead_group, group)
    damaged = fmt.trial_dir(group, "dead") / "tensors" / fmt.chunk_name(50, 100, 100)
    damaged.write_bytes(b"not parquet at all")
    assert main(["scan", "--path", str(group), "--json", "--trial", "dead"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [line for line in document["skipped_chunks"] if damaged.name in line]
    assert any(f["detector"] == "dead_units" for f in document["findings"])


def test_a_second_scan_reads_only_new_chunks(tmp_path, monkeypatch) -> None:
    from comgra.analysis import loading

    group = record(tmp_path, "live", Network(mlp(4, 8, 1), steps=6))
    reads: list[str] = []
    original = loading.read_chunk
    monkeypatch.setattr(loading, "read_chunk", lambda trial, path: reads.append(path.name) or original(trial, path))
    scanner = Scanner()
    first = scanner.scan(group, options=ScanOptions())
    count = len(reads)
    assert count >= 1
    assert scanner.scan(group, options=ScanOptions()).findings == first.findings and len(reads) == count
    # A new chunk (a live run flushing): only it is read.
    source = sorted((fmt.trial_dir(group, "live") / "tensors").glob("*.parquet"))[0]
    shutil.copy(source, source.with_name(fmt.chunk_name(999, 1000, 1000)))
    scanner.scan(group, options=ScanOptions(sensitivity=1.01))
    assert reads[count:] == [fmt.chunk_name(999, 1000, 1000)]


def test_the_progress_bar_takes_updates_from_trials_scanned_side_by_side(monkeypatch) -> None:
    """Trials are scanned side by side: two threads once each started a bar, and a trial's task then
    lived in the bar that was replaced (KeyError, a failed scan)."""
    import threading
    import time

    from rich.progress import Progress

    from comgra.cli import scan as scan_cli

    original_init = Progress.__init__
    calls = []

    def slow_first_init(self, *args, **kwargs) -> None:  # a slow first start: the window for a second bar
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.3)
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(Progress, "__init__", slow_first_init)
    monkeypatch.setattr(scan_cli, "PROGRESS_AFTER_SECONDS", 0.0)
    errors: list[BaseException] = []

    def scan_trial(trial: str, delay: float) -> None:
        time.sleep(delay)
        try:
            for done in range(1, 13):
                bar.update(trial, done, 12)
                time.sleep(0.05)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    with scan_cli._Progress() as bar:
        threads = [threading.Thread(target=scan_trial, args=(t, 0.05 * i)) for i, t in enumerate("abc")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == [] and len(calls) == 1
