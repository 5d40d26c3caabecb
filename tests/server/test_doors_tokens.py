"""A token on every door (issue 31, items 5 and 6), through the real ``comgra`` command in its own process.

On loopback every request that changes a run needs the token printed at start (any user of the machine
reaches 127.0.0.1), reads stay open unless ``--token-for-reads`` (or ``[app] token_for_reads``) says so; off
loopback every request needs it. The printed ``?token=`` link and ``Authorization: Bearer`` both work,
whatever ``--host``; ``--no-token`` is the explicit opt-out of a single-user machine, on loopback only.
"""
from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

BREAKPOINT = {"target": "loss", "condition": "has_nan"}


@contextmanager
def comgra_process(recording: Path, *options: str, cwd: Path | None = None) -> Iterator[tuple[list[str], str]]:
    """``comgra --path RECORDING --port 0 OPTIONS``: (the addresses it printed, its first lines)."""
    process = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "--path", str(recording), "--port", "0",
                                *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = []
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "Ctrl+C" in line:
                break
        for _ in range(2 if "0.0.0.0" in options else 1):
            lines.append(process.stdout.readline())  # type: ignore[union-attr]
        text = "".join(lines)
        yield re.findall(r"(http://\S+)", text), text
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def call(url: str, body: Any = None, *, method: str = "GET", headers: dict[str, str] | None = None,
         opener: urllib.request.OpenerDirector | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with (opener.open if opener else urllib.request.urlopen)(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def split(link: str) -> tuple[str, str]:
    base, token = link.split("/?token=")
    return base, token


def a_browser() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def trial_of(recording: Path) -> str:
    return sorted(p.name for p in (recording / "trials").iterdir())[0]


def test_on_loopback_reads_are_open_and_every_change_needs_the_printed_token(fresh_recording: Path) -> None:
    trial = trial_of(fresh_recording)
    with comgra_process(fresh_recording) as (links, text):
        assert len(links) == 1 and "/?token=" in links[0], text
        base, token = split(links[0])
        assert len(token) >= 24 and f"Bearer ...): {token}" in text
        breakpoints = f"{base}/api/v1/trials/{trial}/breakpoints"
        assert call(f"{base}/api/v1/trials")[0] == 200  # reads: open on loopback, as TensorBoard's
        for action in ("continue", "step", "abort"):
            status, answer = call(f"{base}/api/v1/trials/{trial}/run/{action}", method="POST")
            assert status == 401 and json.loads(answer)["error"]["field"] == "Authorization", answer
        status, answer = call(breakpoints, BREAKPOINT, method="POST")
        assert status == 401 and "token" in answer
        assert call(breakpoints, BREAKPOINT, method="POST", headers={"Authorization": "Bearer wrong"})[0] == 401
        status, created = call(breakpoints, BREAKPOINT, method="POST", headers={"Authorization": f"Bearer {token}"})
        assert status == 201, created
        browser = a_browser()  # the printed link: the browser keeps the token as a cookie
        status, page = call(links[0], opener=browser)
        assert status == 200 and "_dash-config" in page
        status, answer = call(f"{breakpoints}/{json.loads(created)['id']}", method="DELETE", opener=browser)
        assert status in (200, 204), answer
        assert json.loads(call(breakpoints)[1])["breakpoints"] == []


def test_token_for_reads_on_the_command_line_and_in_comgra_toml(fresh_recording: Path, tmp_path: Path) -> None:
    settings = tmp_path / "elsewhere"
    settings.mkdir()
    (settings / "comgra.toml").write_text("[app]\ntoken_for_reads = true\n")
    for options, cwd in ((("--token-for-reads",), None), ((), settings)):
        with comgra_process(fresh_recording, *options, cwd=cwd) as (links, text):
            base, token = split(links[0])
            for path in ("/", "/_dash-layout", "/api/v1/trials"):
                status, answer = call(base + path)
                assert status == 401 and "token" in answer, (options, path, answer[:200])
            assert call(f"{base}/api/v1/trials", headers={"Authorization": f"Bearer {token}"})[0] == 200
            browser = a_browser()
            assert call(links[0], opener=browser)[0] == 200  # the link sets the cookie, then the page loads
            assert call(f"{base}/_dash-layout", opener=browser)[0] == 200
            assert call(f"{base}/?token=wrong")[0] == 401


def test_bound_to_every_interface_the_printed_links_work_and_everything_needs_the_token(fresh_recording: Path) -> None:
    with comgra_process(fresh_recording, "--host", "0.0.0.0") as (links, text):
        assert len(links) == 2 and all("/?token=" in link for link in links), text
        assert "0.0.0.0" not in " ".join(links)  # an address a browser can open: this machine's name, and 127.0.0.1
        local = next(link for link in links if link.startswith("http://127.0.0.1:"))
        base, token = split(local)
        assert split(links[0])[1] == token
        assert call(f"{base}/api/v1/trials")[0] == 401
        assert call(f"{base}/")[0] == 401
        browser = a_browser()
        assert call(local, opener=browser)[0] == 200
        assert call(f"{base}/api/v1/trials", opener=browser)[0] == 200
        trial = trial_of(fresh_recording)
        status, _ = call(f"{base}/api/v1/trials/{trial}/breakpoints", BREAKPOINT, method="POST", opener=browser)
        assert status == 201


def test_no_token_is_an_explicit_opt_out_on_loopback_only(fresh_recording: Path) -> None:
    trial = trial_of(fresh_recording)
    with comgra_process(fresh_recording, "--no-token") as (links, text):
        assert "?token=" not in links[0] and "without a token" in text
        status, _ = call(f"{links[0].rstrip('/')}/api/v1/trials/{trial}/breakpoints", BREAKPOINT, method="POST")
        assert status == 201
    result = subprocess.run([sys.executable, "-m", "comgra.cli.app", "--path", str(fresh_recording), "--port", "0",
                             "--host", "0.0.0.0", "--no-token"], capture_output=True, text=True, timeout=120,
                            env={**os.environ})
    assert result.returncode == 2 and "--no-token" in result.stderr, result.stderr
