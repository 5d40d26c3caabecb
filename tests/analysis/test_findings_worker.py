"""One background scanner per service: each trial scanned once per data version, badges once it is done,
and the default sensitivity from comgra.toml (``[anomalies] sensitivity``; the CLI flag wins)."""
from __future__ import annotations

import json
import shutil
import threading

import pytest

torch = pytest.importorskip("torch")

from planted import record_dead_and_healthy  # noqa: E402

from comgra.analysis import scan  # noqa: E402
from comgra.cli.app import main  # noqa: E402
from comgra.errors import ConfigError  # noqa: E402
from comgra.service import RecordingService  # noqa: E402
from comgra.service.findings import MAX_SCAN_THREADS  # noqa: E402
from comgra.store import format as fmt  # noqa: E402
from comgra.store import layout


@pytest.fixture(scope="module")
def two_trials(tmp_path_factory):
    return record_dead_and_healthy(tmp_path_factory.mktemp("worker"))


def _scan_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "comgra-findings"]


def test_every_question_is_answered_by_one_scan_per_trial(two_trials, tmp_path, counted_scans) -> None:
    group = tmp_path / "group"
    shutil.copytree(two_trials, group, ignore=shutil.ignore_patterns("analysis"))  # never scanned
    service = RecordingService(group)
    try:
        for _ in range(5):  # the graph's first views of both trials, again and again, and the tab
            service.finding_badges("dead")
            service.finding_badges("healthy")
            assert len(_scan_threads()) <= MAX_SCAN_THREADS
        found = service.findings()
        assert service.findings("dead") == [f for f in found if f.trial == "dead"]
        assert service.finding_badges("dead") == {"layer0": "1 \u26a0"}
        assert sorted(counted_scans) == ["dead", "healthy"]
        # New data in one trial (a live run's flush): that trial alone is scanned again, once.
        version = service.findings_version("dead")
        source = sorted((layout.rank_dir(fmt.trial_dir(group, "dead"), "tensors", 0)).glob("*.parquet"))[0]
        shutil.copy(source, source.with_name(fmt.chunk_name(999, 1000, 1000)))
        for _ in range(3):
            service.finding_badges("dead")
        service.findings()
        assert sorted(counted_scans) == ["dead", "dead", "healthy"]
        assert service.findings_version("dead") == version + 1
    finally:
        service.close()


def test_badges_come_once_the_scan_is_done_without_waiting_for_it(two_trials, tmp_path, monkeypatch) -> None:
    release = threading.Event()
    original = scan.detect_all
    monkeypatch.setattr(scan, "detect_all", lambda data, options: release.wait(30) and original(data, options))
    group = tmp_path / "group"
    shutil.copytree(two_trials, group, ignore=shutil.ignore_patterns("analysis"))  # never scanned
    service = RecordingService(group)
    try:
        before = service.findings_version("dead")
        assert service.finding_badges("dead") == {}  # the scan is slow: the graph is drawn without badges
        progress = service.findings_progress()
        assert "dead" in progress.pending and progress.findings == []
        release.set()
        assert service.findings_progress("dead", wait_seconds=60).pending == []
        assert service.findings_version("dead") > before  # what tells the app to ask again
        assert service.finding_badges("dead") == {"layer0": "1 \u26a0"}
    finally:
        release.set()
        service.close()



def test_a_poll_while_trials_wait_for_the_scan_looks_at_none_of_them(two_trials, tmp_path, monkeypatch) -> None:
    """The app asks for the progress every second while a scan is pending (the start-here strip): at 1,000 trials,
    checking every waiting trial's chunks and saved file on each poll took 2-3 s and held the page's callbacks."""
    from comgra.service import findings as findings_module

    release = threading.Event()
    original = scan.detect_all
    monkeypatch.setattr(scan, "detect_all", lambda data, options: release.wait(30) and original(data, options))
    looked: list[str] = []
    signature = findings_module.trial_signature
    poller = threading.current_thread()  # the scan's own thread reads its trial's signature too: not a poll's

    def counted(trial):
        if threading.current_thread() is poller:
            looked.append(trial.trial_id)
        return signature(trial)

    monkeypatch.setattr(findings_module, "trial_signature", counted)
    group = tmp_path / "group"
    shutil.copytree(two_trials, group, ignore=shutil.ignore_patterns("analysis"))  # never scanned
    service = RecordingService(group)
    try:
        assert sorted(service.findings_progress().pending) == ["dead", "healthy"]
        looked.clear()
        for _ in range(5):
            assert sorted(service.findings_progress().pending) == ["dead", "healthy"]
        assert looked == []  # both wait or are being scanned: nothing of theirs was listed or read
        release.set()
        assert service.findings_progress(wait_seconds=60).pending == []
        assert any(f.detector == "dead_units" for f in service.findings_progress().findings)
    finally:
        release.set()
        service.close()

def test_configured_sensitivity_is_the_services_default(two_trials) -> None:
    service = RecordingService(two_trials)
    try:
        assert any(f.detector == "dead_units" for f in service.findings("dead"))
        service.configure_findings(sensitivity=0.01)  # every threshold 100 times higher
        assert service.findings_options.sensitivity == 0.01
        assert not any(f.detector == "dead_units" for f in service.findings("dead"))
        with pytest.raises(ConfigError, match="sensitivity"):
            service.configure_findings(sensitivity=0.0)
    finally:
        service.close()


def test_app_takes_the_sensitivity_of_comgra_toml(two_trials, tmp_path, monkeypatch) -> None:
    from comgra.cli import app as cli_app

    (tmp_path / "comgra.toml").write_text("[anomalies]\nsensitivity = 0.01\n")
    monkeypatch.chdir(tmp_path)
    seen = {}
    monkeypatch.setattr(cli_app, "_run_server", lambda group, **options: seen.update(options) or 0)
    assert cli_app.main(["--path", str(two_trials)]) == 0
    assert seen["findings_sensitivity"] == 0.01
    from comgra.server.app import create_app

    app = create_app(two_trials, warm_up=False, findings_sensitivity=seen["findings_sensitivity"])
    assert app is not None


def _dead_units(capsys, *arguments: str) -> int:
    assert main(["scan", "--json", *arguments]) == 0
    return sum(f["detector"] == "dead_units" for f in json.loads(capsys.readouterr().out)["findings"])


def test_scan_takes_the_sensitivity_of_comgra_toml_and_the_flag_wins(two_trials, tmp_path, monkeypatch,
                                                                      capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert _dead_units(capsys, "--path", str(two_trials)) == 1  # no comgra.toml: sensitivity 1
    (tmp_path / "comgra.toml").write_text("[anomalies]\nsensitivity = 0.01\n")
    assert _dead_units(capsys, "--path", str(two_trials)) == 0
    assert _dead_units(capsys, "--path", str(two_trials), "--sensitivity", "1") == 1
    other = tmp_path / "other.toml"
    other.write_text("[anomalies]\nsensitivity = 1.0\n")
    assert _dead_units(capsys, "--path", str(two_trials), "--config", str(other)) == 1


def test_a_zero_sensitivity_in_comgra_toml_is_one_line_and_exit_2(two_trials, tmp_path, monkeypatch,
                                                                  capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "comgra.toml").write_text("[anomalies]\nsensitivity = 0\n")
    assert main(["scan", "--path", str(two_trials)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "anomalies.sensitivity" in error and "above 0" in error


def test_the_scan_starts_no_trial_while_the_app_answers(two_trials, tmp_path, monkeypatch, counted_scans) -> None:
    """The background scan makes way for the app's answers (its work holds the GIL: the Runs rows of 1,000 trials
    asked at once on a fresh app took twice their CPU time beside it), and an answer that waits for the scan itself
    (the REST findings) lets it run."""
    from comgra.service import findings as findings_module

    monkeypatch.setattr(findings_module, "WAIT_AT_MOST_SECONDS", 60.0)  # no way round the gate within the test
    group = tmp_path / "group"
    shutil.copytree(two_trials, group, ignore=shutil.ignore_patterns("analysis"))  # never scanned
    service = RecordingService(group)
    try:
        with service.answering():
            assert sorted(service.findings_progress().pending) == ["dead", "healthy"]  # queued, the thread started
            threading.Event().wait(1.5)
            assert counted_scans == []  # nothing scanned while the answer runs
        assert service.findings_progress(wait_seconds=60).pending == []
        assert sorted(counted_scans) == ["dead", "healthy"]
        # An answer that waits for the scan steps aside: new data in one trial is scanned while it waits.
        source = sorted((layout.rank_dir(fmt.trial_dir(group, "dead"), "tensors", 0)).glob("*.parquet"))[0]
        shutil.copy(source, source.with_name(fmt.chunk_name(999, 1000, 1000)))
        done = threading.Event()

        def an_answer_that_waits() -> None:
            with service.answering():
                service.findings("dead")
            done.set()

        threading.Thread(target=an_answer_that_waits).start()
        assert done.wait(30), "an answer waiting for the scan held the scan back"
        assert sorted(counted_scans) == ["dead", "dead", "healthy"]
    finally:
        service.close()


def test_the_app_answers_each_request_inside_the_services_answering(two_trials, tmp_path, monkeypatch) -> None:
    from comgra.server.app import create_app
    from comgra.service import findings as findings_module

    entered: list[str] = []
    original = findings_module.Foreground.answering

    def counted(self):
        entered.append(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(findings_module.Foreground, "answering", counted)
    app = create_app(two_trials, warm_up=False, findings_scan=False)
    assert app.server.test_client().get("/api/v1/runs").status_code == 200
    assert len(entered) == 1


def test_the_scanner_imports_its_libraries_a_part_at_a_time_when_the_app_is_quiet(two_trials, tmp_path) -> None:
    """scipy and scikit-learn took 1.5-2.5 s of the GIL in one piece when the scanner first ran, whatever the app
    was answering: they are imported a part at a time, each after the scanner waited for quiet (a fresh interpreter,
    in which none is imported yet)."""
    import subprocess
    import sys

    group = tmp_path / "group"
    shutil.copytree(two_trials, group, ignore=shutil.ignore_patterns("analysis"))  # never scanned
    program = f"""
import sys, threading
from comgra.service import RecordingService
from comgra.service import findings
findings.WAIT_AT_MOST_SECONDS = 60.0
seen = []  # how many of the libraries were imported at each wait for quiet
wait_quiet = findings.Foreground.wait_quiet
def counted(self, *args, **kwargs):
    seen.append(sum(n in sys.modules for n in findings.LIBRARIES))
    return wait_quiet(self, *args, **kwargs)
findings.Foreground.wait_quiet = counted
service = RecordingService({str(group)!r})
with service.answering():
    service.findings_progress()
    threading.Event().wait(1.5)
    print("while answering:", sorted(n for n in findings.LIBRARIES if n in sys.modules))
print("pending:", service.findings_progress(wait_seconds=120).pending)
print("after:", sorted(n for n in findings.LIBRARIES if n not in sys.modules))
print("waits before the first trial:", len(set(seen)) - 1)
service.close()
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["while answering: []", "pending: []", "after: []"]
    assert int(lines[3].rpartition(" ")[2]) >= 5  # waited between the parts (not only before the first trial)


def test_the_queue_puts_the_trials_asked_for_first_in_their_order(two_trials) -> None:
    """``request`` moves the trials it is asked for to the front of the queue (in the order asked), leaves a trial
    being scanned out of it, and keeps the rest behind them in their order, once each."""
    from comgra.service.findings import FindingsWorker
    from comgra.store.reader import GroupReader

    worker = FindingsWorker(GroupReader(two_trials), scan.ScanOptions())
    worker._stale = lambda trial: True  # every trial's data is new: each one asked for is stale
    worker._threads = MAX_SCAN_THREADS  # no scan thread starts: the queue is looked at as it is
    worker.request(["a", "b", "c", "d"])
    assert worker._queue == ["a", "b", "c", "d"]
    worker._running.add(worker._queue.pop(0))  # "a" is being scanned
    assert worker.request(["c", "a", "y", "c"]) == ["c", "a", "y", "c"]
    assert worker._queue == ["c", "y", "b", "d"]
    worker.request([f"t{i}" for i in range(2000)])
    assert worker._queue[:2] == ["t0", "t1"] and worker._queue[-4:] == ["c", "y", "b", "d"]
    assert len(worker._queue) == len(set(worker._queue)) == 2004
