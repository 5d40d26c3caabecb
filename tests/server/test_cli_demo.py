"""``comgra demo`` as a user runs it: a real process that binds its port first, serves at once while a child
records the tutorial into the app, reports its progress, and says where the recording is however it ends."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")


def _start(tmp_path: Path, *arguments: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "demo", *arguments],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd or tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _url(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        match = re.search(r"open (http://[^\s?]+)", line)  # the address without its ?token= (reads need none)
        if match:
            return match.group(1).rstrip("/")
    raise AssertionError("the demo never printed its address")


def _trials(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/api/v1/trials", timeout=30) as response:
        answer = json.load(response)
    rows = answer["trials"] if isinstance(answer, dict) else answer
    return sorted(row["trial"] if isinstance(row, dict) else str(row) for row in rows)


def _stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)  # Ctrl+C
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    return process.returncode, err


def test_the_demo_serves_at_once_and_fills_in_while_it_records(tmp_path: Path) -> None:
    root = tmp_path / "rec"
    started = time.monotonic()
    process = _start(tmp_path, "--steps", "16", "--path", str(root), "--port", "0")
    try:
        url = _url(process)
        served_after = time.monotonic() - started
        with urllib.request.urlopen(url + "/", timeout=30) as response:  # the page, before anything is recorded
            assert response.status == 200
        # Within 10 s of the command on a machine with a core to spare; a shared machine's load stretches that.
        limit = 10 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
        assert served_after < limit, f"served after {served_after:.1f} s (limit {limit:.0f} s at this load)"
        deadline = time.monotonic() + 600
        while len(_trials(url)) < 2 and time.monotonic() < deadline:  # the app fills in as the child records
            time.sleep(1)
        assert _trials(url) == ["trial_bugged_original_version", "trial_no_activation_function_on_output_layer"]
        deadline = time.monotonic() + 300
        while not (root / "demo" / "trials" / "trial_no_activation_function_on_output_layer").is_dir() \
                and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        code, err = _stop(process)
    assert code == 0, err
    assert re.search(r"comgra: recorded \d+/32 steps \(trial_bugged_original_version\), \d+ s, about \d+ s left", err), err
    group = root / "demo"
    assert f"the recording is in {group}; open it with: comgra {group}" in err
    assert "Traceback" not in err


def test_a_busy_port_fails_at_once_and_records_nothing(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        process = _start(tmp_path, "--path", str(tmp_path / "rec"), "--port", str(port))
        _, err = process.communicate(timeout=120)
        took = time.monotonic() - started
    assert process.returncode == 2 and "try another --port. Nothing was recorded." in err, err
    assert not list((tmp_path / "rec" / "demo" / "trials").iterdir())
    assert took < 60  # never the whole recording first (that took minutes)


def test_a_failing_recording_says_where_the_recording_is_and_how_to_open_it(tmp_path: Path) -> None:
    (tmp_path / "comgra.toml").write_text("[recording\n")  # the child's recorder refuses it
    root = tmp_path / "rec"
    process = _start(tmp_path, "--steps", "20", "--path", str(root), "--port", "0")
    try:
        url = _url(process)
        assert _trials(url) == []  # the app serves, empty
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if "the recording stopped" in line:
                break
        text = "".join(lines)
        group = root / "demo"
        assert f"the recording stopped with exit code 1" in text and f"open it with: comgra {group}" in text, text
    finally:
        _stop(process)
