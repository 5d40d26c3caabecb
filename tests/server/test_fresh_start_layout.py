"""No "Error loading layout" at start (issue 31 item 14): fresh ``comgra`` processes, each hit at once, in its
first moment, by the requests a browser's first page sends side by side. Before the fix a thread met pandas
half-imported by another (plotly's encoder: "partially initialized module 'pandas'") on 3 of 5 starts."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

FIRST_PAGE = ("/", "/_dash-layout", "/_dash-dependencies", "/_dash-layout", "/api/v1/trials", "/_dash-layout")
STARTS = 5


def _first_requests(link: str) -> list[tuple[str, int]]:
    base = link.split("?")[0].rstrip("/")
    answers: list[tuple[str, int]] = []
    barrier = threading.Barrier(len(FIRST_PAGE))

    def get(path: str) -> None:
        barrier.wait()
        try:
            with urllib.request.urlopen(base + path, timeout=120) as response:
                answers.append((path, response.status))
        except urllib.error.HTTPError as error:
            with error:
                answers.append((path, error.code))

    threads = [threading.Thread(target=get, args=(path,)) for path in FIRST_PAGE]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    return answers


def test_every_fresh_start_answers_its_first_page_at_once(recording: Path) -> None:
    failed = []
    for start in range(STARTS):
        process = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "--path", str(recording), "--port", "0"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            link = next(m.group(1) for line in process.stdout if (m := re.search(r"(http://\S+)", line)))  # type: ignore[union-attr]
            answers = _first_requests(link)
        finally:
            process.send_signal(signal.SIGINT)
            output = process.communicate(timeout=30)[0]
        assert len(answers) == len(FIRST_PAGE)
        if any(status != 200 for _, status in answers) or "Traceback" in output:
            failed.append((start, answers, output[-600:]))
    assert failed == [], failed
