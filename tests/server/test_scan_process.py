"""``comgra``'s own server scans for findings in a child process (issue 31 item 13): the scan's memory, which grows
with a live run, is that process's and goes back to the system with it; the server never loads the detectors'
libraries. The answers are those of an in-process scan; a child that dies is a problem of that trial, not of the
server."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from comgra.analysis import Finding, Scanner, ScanOptions
from comgra.service import scan_process
from comgra.store.reader import GroupReader

DETECTORS_LIBRARIES = ("/sklearn/", "/scipy/")  # shared objects of the detectors' libraries, as mapped


def _mapped_libraries(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as maps:
        return {line.split()[-1] for line in maps if line.rstrip().endswith(".so") or ".so." in line}


def _findings_of(url: str, trial: str) -> list[dict]:
    deadline = time.monotonic() + 180
    while True:
        with urllib.request.urlopen(f"{url}/api/v1/findings?trial={trial}", timeout=180) as response:
            entry = json.loads(response.read())["findings"][0]
        if not entry.get("refreshing") and not entry.get("pending") or time.monotonic() > deadline:
            return entry["findings"]
        time.sleep(0.5)


def test_the_server_scans_in_a_child_process_and_answers_as_an_in_process_scan(tmp_path, fresh_recording):
    group = GroupReader(fresh_recording)
    trial = group.trials()[0]
    expected = Scanner().scan(fresh_recording, trials=[trial]).findings
    for analysis in Path(fresh_recording).rglob("findings-*.json"):  # what that scan saved: the server must scan
        analysis.unlink()
    process = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "--path", str(fresh_recording), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert process.stdout is not None
        url = next(m.group(1) for line in process.stdout if (m := re.search(r"(http://[^\s?]+)", line)))
        found = _findings_of(url.rstrip("/"), trial)
        assert [(f["detector"], f["node"], f["message"]) for f in found] == \
               [(f.detector, f.node, f.message) for f in expected] and expected
        children = psutil.Process(process.pid).children()
        scanning = [child for child in children if "spawn_main" in " ".join(child.cmdline())]
        assert scanning, children  # the scan's process
        served = psutil.Process(process.pid).nice()  # the scan yields the cores to the server's answers
        assert all(child.nice() == min(19, served + scan_process.NICENESS) for child in scanning)
        mapped = _mapped_libraries(process.pid)
        assert not [path for path in mapped if any(name in path for name in DETECTORS_LIBRARIES)]
        process.send_signal(signal.SIGINT)  # Ctrl+C: the child ends with the server, nothing left behind
        rest = process.communicate(timeout=30)[0]
        assert process.returncode == 0 and "Traceback" not in rest and "leaked" not in rest, rest
        assert not psutil.wait_procs(children, timeout=30)[1]  # the scan's process and its helper end too
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _dies(data, facts, options):  # a user detector that takes the scan's process down with it
    os._exit(3)


def _flags_the_loss(data, facts, options):  # a user detector: the child must run it too
    return [Finding(detector="flags_the_loss", severity="info", score=1.0, trial=data.trial, node="loss", role=None,
                    kind=None, training_step=None, message="user detector ran")]


def test_a_dying_scan_process_is_the_trials_problem_and_the_next_scan_works(fresh_recording):
    trial = GroupReader(fresh_recording).trials()[0]
    scans = scan_process.ScanProcess(str(fresh_recording), [("dies", __name__, "_dies")])
    try:
        found, problems = scans.scan(trial, ScanOptions())
        assert found == [] and len(problems) == 1 and "process ended" in problems[0] and trial in problems[0]
        scans.detectors = [("flags_the_loss", __name__, "_flags_the_loss")]
        found, problems = scans.scan(trial, ScanOptions())
        assert "flags_the_loss" in {f.detector for f in found} and scans.started == 2
    finally:
        scans.close()


def test_a_detector_another_process_cannot_import_keeps_the_scan_here(monkeypatch):
    from comgra.analysis import custom

    def local(data, facts, options):
        return []

    monkeypatch.setattr(custom, "_registered", {"importable": _dies})
    assert scan_process.importable_detectors() == [("importable", __name__, "_dies")]
    monkeypatch.setattr(custom, "_registered", {"importable": _dies, "local": local})
    assert scan_process.importable_detectors() is None
