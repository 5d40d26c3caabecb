"""Recorded text never drives the terminal (issue 31 item 9): a trial named with escape sequences (clear screen,
window title, a bidirectional override) and Rich markup is printed as visible escapes by ``comgra scan``, in its
list, its verbose text, its error messages, its progress bar, and in the log lines and warnings of a comgra
command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NASTY = "t\x1b]0;PWNED\x07\x1b[2J[bold red]x\u202e\x9b"
RAW = ("\x1b", "\x07", "\u202e", "\x9b")


@pytest.fixture(scope="module")
def nasty_recording(tmp_path_factory: pytest.TempPathFactory, synthetic) -> Path:
    group = tmp_path_factory.mktemp("nasty") / "synthetic"
    group.mkdir()
    synthetic.write_trial(group, NASTY, 0, synthetic.Options(scale=0.02, trials=1, steps_per_chunk=2))
    return group


def _scan(*arguments: str) -> subprocess.CompletedProcess[str]:
    source = str(Path(__file__).resolve().parents[2] / "src")
    return subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", *arguments], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": source, "COLUMNS": "200"})


@pytest.mark.parametrize("options", [(), ("--verbose",)])
def test_scan_prints_a_trial_s_control_characters_as_escapes(nasty_recording: Path, options: tuple[str, ...]) -> None:
    result = _scan("--path", str(nasty_recording), *options)
    assert result.returncode == 0, result.stderr
    assert "finding(s)" in result.stdout  # the scan found something in that trial, and printed it
    for raw in RAW:
        assert raw not in result.stdout and raw not in result.stderr, repr(raw)
    assert "t\\x1b]0;PWNED\\x07\\x1b[2J[bold red]x\\u202e\\x9b:" in result.stdout  # what it is, visibly; no markup


def test_a_usage_error_naming_the_trial_is_escaped_and_json_stays_exact(nasty_recording: Path) -> None:
    result = _scan("--path", str(nasty_recording), "--trial", "nope")
    assert result.returncode == 2 and "No trial" in result.stderr
    assert not any(raw in result.stderr for raw in RAW), result.stderr
    document = json.loads(_scan("--path", str(nasty_recording), "--json").stdout)  # JSON escapes by itself
    assert {f["trial"] for f in document["findings"]} == {NASTY}


def test_the_progress_bar_takes_a_trial_name_as_text_not_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    from comgra.cli import scan

    monkeypatch.setattr(scan, "PROGRESS_AFTER_SECONDS", 0.0)
    with scan._Progress(terminal=True) as progress:
        progress.update("[/bold] [link=x]\x1b[2J", 1, 3)  # unbalanced markup raised MarkupError in the bar
        (task,) = progress._bar.tasks
    # The bar counts trials (a sweep's thousands of names would flicker past): no recorded text reaches it.
    assert "\x1b" not in task.description and "[/bold]" not in task.description


def test_a_comgra_command_s_log_lines_and_warnings_are_escaped() -> None:
    code = ("import logging, warnings\nfrom comgra import terminal\nterminal.install()\n"
            "logging.getLogger('comgra.server').warning('request for %s failed', '/x\\x1b[2J\\x1b]0;t\\x07')\n"
            "warnings.warn('breakpoints.json of trial \\x1b[31mred\\u202e is damaged')\n")
    source = str(Path(__file__).resolve().parents[2] / "src")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": source})
    assert "request for /x\\x1b[2J\\x1b]0;t\\x07 failed" in result.stderr
    assert "trial \\x1b[31mred\\u202e is damaged" in result.stderr
    assert not any(raw in result.stderr for raw in RAW), result.stderr
