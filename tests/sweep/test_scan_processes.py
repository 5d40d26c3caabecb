"""``comgra scan`` of a local group in a pool of processes (issue 30 item 1: 1,000 trials in 10 minutes on this
machine): the same findings, saved per trial, as the scan in one process; the workers' CPU and memory counted in the
``comgra scan`` process as its parent sees them; a bad ``--workers`` a one-line usage error."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
CHOSEN = 10  # trials of the recorded sweep scanned here (the pool is two processes on this machine)


def _cpu_and_document(group, trials: list[str], *arguments: str) -> tuple[dict, float]:
    chosen = [a for t in trials for a in ("--trial", t)]
    process = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "scan", "--path", str(group), "--json",
                                *chosen, *arguments], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    output = process.stdout.read() if process.stdout else b""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    process.stdout.close()  # type: ignore[union-attr]
    assert process.returncode == 0
    return json.loads(output), usage.ru_utime + usage.ru_stime


def test_a_scan_in_processes_finds_and_saves_what_one_process_does(sweep, tmp_path) -> None:
    import shutil

    from comgra.analysis import ScanOptions, saved
    from comgra.store import GroupReader

    trials = GroupReader(sweep).trials()[:CHOSEN]
    alone = tmp_path / "alone"
    shutil.copytree(sweep, alone)  # both scans cold
    one, one_cpu = _cpu_and_document(alone, trials, "--workers", "1")
    pooled, pooled_cpu = _cpu_and_document(sweep, trials, "--workers", "2")
    strip = [{k: v for k, v in f.items() if k != "link"} for f in pooled["findings"]]
    assert strip == [{k: v for k, v in f.items() if k != "link"} for f in one["findings"]]
    assert {f["trial"] for f in pooled["findings"]} >= {t for t in trials if int(t[1:]) % 7 == 0}  # dead units
    group = GroupReader(sweep)
    for trial in trials:  # each worker saved its trial's findings: a later scan or the app reads them
        reader = group.trial(trial)
        assert saved.read(reader, ScanOptions()) is not None, trial
        assert (sweep / "findings" / f"trial={trial}").is_dir(), trial
    group.close()
    # The workers' CPU is the scan's: a pool that hid its children from wait4 would report almost none.
    assert pooled_cpu > 0.5 * one_cpu, (pooled_cpu, one_cpu)


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_number_of_workers_is_a_usage_error_naming_it(sweep, value) -> None:
    answer = subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", "--path", str(sweep), "--workers",
                             value], capture_output=True, text=True, timeout=300, check=False)
    assert answer.returncode == 2
    assert f"{value!r} is not a number of worker processes" in answer.stderr


def test_a_scan_of_a_sweep_keeps_its_runs_rows_for_the_first_app(sweep) -> None:
    """After ``comgra scan``, a fresh app's Runs rows come from the group's runs summary (no trial read at the
    click), with the findings counts of what the scan saved."""
    from comgra.analysis import ScanOptions, saved
    from comgra.service import RecordingService
    from comgra.service import runs_summary
    from comgra.store import GroupReader

    everyone = GroupReader(sweep).trials()
    chosen = everyone[:3]
    assert not runs_summary.path_of(sweep).exists()
    _cpu_and_document(sweep, chosen, "--workers", "1")
    assert runs_summary.path_of(sweep).is_file()
    service = RecordingService(sweep)
    try:
        rows = {r.trial: r for r in service.runs().runs}
        questions = service.run_questions
        assert (questions.taken, questions.computed) == (len(everyone), 0)
        group = GroupReader(sweep)
        for trial in chosen:
            found = saved.read(group.trial(trial), ScanOptions())
            expected = {s: sum(f.severity == s for f in found.findings) for s in ("error", "warning", "info")}
            assert rows[trial].findings == expected, trial
        group.close()
    finally:
        service.close()
