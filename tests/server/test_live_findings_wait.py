"""A live trial's findings do not wait on the scan under way (issue 31 item 13, round six).

A run that writes changes its data every flush, so a newer scan of its trial is always under way. Before, the
REST answer waited up to ``FINDINGS_WAIT_S`` for that scan, and at load 28 nine answers in 188 took over 2 s.
Here the second scan never ends until the test lets it, and the wait is an hour: the answer must come with the
last result, marked ``refreshing``, while the scan still runs.
"""
from __future__ import annotations

import itertools
import os
import socket
import threading
from typing import Any

import comgra.service.findings as findings_module
from comgra.breakpoints import control
from comgra.server import api
from comgra.server.app import create_app
from comgra.store import GroupReader
from comgra.store import format as fmt


def _ask(http: Any, trial: str, answers: list[Any]) -> None:
    answers.append(http.get("/api/v1/findings", query_string={"trial": trial}))


def test_a_live_trial_s_findings_answer_while_its_scan_runs(fresh_recording, monkeypatch) -> None:
    from comgra.analysis.scan import Scanner

    trial = GroupReader(fresh_recording).trials()[0]
    app = create_app(fresh_recording, poll_seconds=60, warm_up=False)
    http = app.server.test_client()
    first = http.get("/api/v1/findings", query_string={"trial": trial})  # not live yet: scanned to the end
    assert first.status_code == 200
    (entry,) = first.get_json()["findings"]
    assert entry["refreshing"] is False
    expected = [(f["detector"], f["node"], f["message"]) for f in entry["findings"]]

    control.write_run_state(fmt.trial_dir(fresh_recording, trial), {"state": "running", "pid": os.getpid(),
                                                                    "hostname": socket.gethostname()})
    versions = itertools.count()  # a run writing: the trial's data is new at every look
    monkeypatch.setattr(findings_module, "trial_signature", lambda reader: (f"chunk-{next(versions)}",))
    scanning, release = threading.Event(), threading.Event()
    scan = Scanner.scan_and_release

    def slow_scan(self: Any, *args: Any, **kwargs: Any) -> Any:
        scanning.set()
        release.wait(600)
        return scan(self, *args, **kwargs)

    monkeypatch.setattr(Scanner, "scan_and_release", slow_scan)
    monkeypatch.setattr(api, "FINDINGS_WAIT_S", 3600.0)
    answers: list[Any] = []
    try:
        asking = threading.Thread(target=_ask, args=(http, trial, answers), daemon=True)
        asking.start()
        assert scanning.wait(120), "the newer scan never started"
        asking.join(120)  # the scan is held until the answer came: an answer that waits on it never comes
        assert not asking.is_alive() and answers, "the live trial's findings waited for the scan under way"
    finally:
        release.set()
    assert answers[0].status_code == 200
    (entry,) = answers[0].get_json()["findings"]
    assert entry["refreshing"] is True
    assert [(f["detector"], f["node"], f["message"]) for f in entry["findings"]] == expected
