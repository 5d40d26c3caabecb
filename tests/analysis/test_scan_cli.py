"""``comgra scan``: the JSON document, the table, bad input (exit 2, one line), damaged chunks, live runs."""
from __future__ import annotations

import json
import re
import shutil

import pytest

torch = pytest.importorskip("torch")

from planted import Network, mlp, record, record_dead_and_healthy  # noqa: E402

from comgra.analysis import ScanOptions, Scanner  # noqa: E402
from comgra.cli.app import main  # noqa: E402
from comgra.store import format as fmt  # noqa: E402
from comgra.store import layout

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
                            "&aggregation=abs_max&stat=" + dead["statistic"])
    severities = [f["severity"] for f in findings]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)


def test_verbose_and_trial_filter(dead_group, capsys) -> None:
    assert main(["scan", "--path", str(dead_group), "--trial", "dead", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "dead_units" in out and "layer0" in out and "healthy" not in out


def _json_findings(group, capsys) -> list[dict]:
    assert main(["scan", "--path", str(group), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["findings"]


def test_the_list_is_one_line_per_finding_within_the_width_and_ends_with_the_next_command(dead_group, capsys,
                                                                                        monkeypatch) -> None:
    findings = _json_findings(dead_group, capsys)
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["scan", "--path", str(dead_group)]) == 0
    lines = capsys.readouterr().out.splitlines()
    trials = list(dict.fromkeys(f["trial"] for f in findings))
    # a title, a heading per trial, a line per finding, a line for each trial with infos only, the next command
    infos_only = [t for t in trials if all(f["severity"] == "info" for f in findings if f["trial"] == t)]
    assert infos_only == ["healthy"]
    assert len(lines) == 1 + len(trials) + len(findings) + len(infos_only) + 1
    assert lines[0].startswith(f"{len(findings)} finding(s) in {len(trials)} of {len(trials)} trial(s)")
    rows = [line for line in lines if re.match(r"^ +\d+ ", line)]
    assert len(rows) == len(findings) and all(len(row) <= 100 for row in rows)
    for row in rows:  # the rank, the severity and the node of the finding with that rank, in that order
        number, severity, node = row.split()[:3]
        finding = findings[int(number) - 1]
        assert (severity, node) == (finding["severity"], finding["node"])
    assert [line.rstrip(":") for line in lines if line.endswith(":") and not line[0].isspace()][1:] == trials
    # The message of the input finding keeps its brackets: "|input[0]|" is not Rich markup.
    input_finding = next(f for f in findings if "[0]" in f["message"])
    row = rows[[int(r.split()[0]) for r in rows].index(findings.index(input_finding) + 1)]
    assert "[0]" in row and row.rstrip("…") .split("  ")[-1].strip() in " ".join(input_finding["message"].split())
    assert lines[-1] == ("Next, to open the app on finding 1: comgra " + str(dead_group)
                         + f" --view '{findings[0]['link']}'")


def test_verbose_prints_every_message_in_full_and_its_link(dead_group, capsys, monkeypatch) -> None:
    findings = _json_findings(dead_group, capsys)
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["scan", "--path", str(dead_group), "--verbose"]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for finding in findings:
        assert " ".join(finding["message"].split()) in flat
        assert f"{finding['detector']} · {finding['link']}" in out


def test_no_part_of_a_finding_is_read_as_markup() -> None:
    import io

    from rich.console import Console

    from comgra.analysis.findings import Finding
    from comgra.cli.scan import print_findings

    message = "x[i] is [bold]huge[/bold] at [red]step 3. Look at [link=http://e.example]it[/link]."
    finding = Finding(detector="outlier", severity="warning", score=1.0, trial="[t]", node="x[i]", role=None,
                      kind=None, training_step=3, message=message)
    for verbose in (False, True):
        out = io.StringIO()
        print_findings(Console(file=out, width=200, highlight=False, markup=False), [finding], ["[yellow]damaged"],
                       ["[t]"], verbose=verbose, link=lambda f: "/?tab=tensors&node=x%5Bi%5D", path="[p]")
        text = out.getvalue()
        assert "[t]:" in text and "x[i] @ step 3" in text and "[yellow]damaged" in text
        assert ("is [bold]huge[/bold] at [red]step 3." in text) if not verbose else (message in text)


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
    damaged = layout.rank_dir(fmt.trial_dir(group, "dead"), "tensors", 0) / fmt.chunk_name(50, 100, 100)
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
    source = sorted((layout.rank_dir(fmt.trial_dir(group, "live"), "tensors", 0)).glob("*.parquet"))[0]
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

    with scan_cli._Progress(terminal=True) as bar:
        threads = [threading.Thread(target=scan_trial, args=(t, 0.05 * i)) for i, t in enumerate("abc")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == [] and len(calls) == 1


def test_progress_off_a_terminal_is_plain_lines_in_trials(monkeypatch, capsys) -> None:
    """Off a terminal (a log, CI) the scan says how far it is in plain lines, at most one per interval, and a
    last one at the end; no Rich bar, no control characters."""
    from comgra.cli import scan as scan_cli

    monkeypatch.setattr(scan_cli, "PROGRESS_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(scan_cli, "PLAIN_EVERY_SECONDS", 3600.0)
    with scan_cli._Progress(terminal=False) as bar:
        for done in range(1, 1001):
            bar.update(f"t{done}", done, 1000)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["comgra scan: 1/1000 trials scanned",
                                                      "comgra scan: 1000/1000 trials scanned"]
    assert all("\x1b" not in line for line in lines)


def test_a_trial_without_findings_or_with_infos_only_says_so() -> None:
    """The demo's fixed trial: "no findings" is the point of the comparison, and is printed."""
    import io

    from rich.console import Console

    from comgra.analysis.findings import Finding
    from comgra.cli.scan import print_findings

    def finding(trial: str, severity: str) -> Finding:
        return Finding(detector="outlier", severity=severity, score=1.0, trial=trial, node="x", role=None, kind=None,
                       training_step=3, message="x is odd at step 3.")

    out = io.StringIO()
    print_findings(Console(file=out, width=120, highlight=False), [finding("bugged", "warning"), finding("hints", "info")],
                   [], ["bugged", "hints", "fixed"], verbose=False, link=lambda f: "/?tab=findings", path="runs/demo")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("2 finding(s) in 2 of 3 trial(s)")
    assert "fixed: no findings" in lines
    hints = lines.index("hints:")
    assert "no warnings or errors" in lines[hints + 2] and not any("no warnings" in line for line in lines[:hints])
