"""The scan of a sweep holds memory flat in the number of trials (issue 30 item 1): what a trial left behind (its
reader, its DuckDB connection, its chunks, its answer) is let go of once its findings are saved. Measured as a
user meets it: the peak RSS of ``comgra scan`` (a real process) over the first 20 trials and over all 80, and the
RSS of the app's background scanner after 20 and after 80 trials. Before this, both grew about 4.8 MiB per trial."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
MIB_PER_TRIAL = 0.5  # the bound of issue 30: at most this much more per trial than over the first trials


def _peak_rss_mib(arguments: list[str]) -> float:
    """The peak RSS of a process that runs ``arguments``, from the kernel's accounting of that child alone."""
    process = subprocess.Popen(arguments, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0, process.stderr.read().decode()
    process.stderr.close()
    return usage.ru_maxrss / 1024


def _scan_command(group, trials: list[str] | None = None) -> list[str]:
    chosen = [a for t in trials for a in ("--trial", t)] if trials else []
    return [sys.executable, "-m", "comgra.cli.app", "scan", "--path", str(group), "--json", *chosen]


def test_comgra_scan_of_a_sweep_grows_at_most_half_a_mebibyte_per_trial(sweep, tmp_path) -> None:
    from comgra.store import GroupReader

    trials = GroupReader(sweep).trials()
    assert len(trials) == 80
    first = tmp_path / "first"
    import shutil

    shutil.copytree(sweep, first)  # both scans cold: nothing saved yet
    few = _peak_rss_mib(_scan_command(first, trials[:20]))
    all_of_them = _peak_rss_mib(_scan_command(sweep))
    per_trial = (all_of_them - few) / 60
    assert per_trial <= MIB_PER_TRIAL, f"peak RSS {few:.0f} MiB at 20 trials, {all_of_them:.0f} MiB at 80"


_APP_SCAN = """
import sys
from comgra.analysis.loading import return_freed_memory
from comgra.service import RecordingService
from comgra.store import GroupReader

def rss():
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1]) / 1024

service = RecordingService(sys.argv[1])
marks = {}
for count, trial in enumerate(GroupReader(sys.argv[1]).trials(), 1):
    assert service.finding_questions.findings_progress(trial, wait_seconds=600).pending == []
    if count % 10 == 0:
        return_freed_memory()
        marks[count] = rss()
service.close()
print(marks[20], marks[80])
"""


def test_the_apps_background_scanner_grows_at_most_half_a_mebibyte_per_trial(sweep) -> None:
    answer = subprocess.run([sys.executable, "-c", _APP_SCAN, str(sweep)], capture_output=True, text=True,
                            timeout=900, check=False)
    assert answer.returncode == 0, answer.stderr
    at_20, at_80 = map(float, answer.stdout.split())
    assert (at_80 - at_20) / 60 <= MIB_PER_TRIAL, f"RSS {at_20:.0f} MiB after 20 trials, {at_80:.0f} MiB after 80"
