"""A recording from someone else is data, never code (issue 31 item 7).

A crafted recording ships Python files (a detector named by a comgra.toml beside it, and modules named like
libraries comgra imports later) that each leave a marker when imported. ``comgra scan`` and the app are run
from inside it in every way that puts the folder on ``sys.path``: ``PYTHONPATH=.``, ``python -m``. Nothing of
it may run, the scan must still work, and the comgra.toml it ships is not read as the user's settings.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from comgra.config import load_settings, recording_around

SHIPPED = ("evil", "rich", "pandas", "duckdb", "pyarrow")  # a detector, and libraries comgra imports later


@pytest.fixture
def crafted(fresh_recording: Path, tmp_path: Path) -> tuple[Path, Path]:
    markers = tmp_path / "markers"
    markers.mkdir()
    for name in SHIPPED:
        (fresh_recording / f"{name}.py").write_text(
            f"open({str(markers / name)!r}, 'w').close()\n"
            "def detector(data, facts, options):\n    return []\n")
    (fresh_recording / "comgra.toml").write_text('[anomalies]\ndetectors = ["evil:detector"]\nsensitivity = 50\n')
    return fresh_recording, markers


def _environment(*extra: str) -> dict[str, str]:
    source = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*extra, source])}


COMMANDS = {
    "console script, PYTHONPATH=.": ([str(Path(sys.executable).parent / "comgra"), "scan", "--path", "."], ("." ,)),
    "python -m comgra.cli.app": ([sys.executable, "-m", "comgra.cli.app", "scan", "--path", "."], ()),
    "python -m comgra.cli.scan": ([sys.executable, "-m", "comgra.cli.scan", "--path", "."], ()),
    "PYTHONPATH=absolute folder": ([sys.executable, "-m", "comgra.cli.app", "scan", "--path", ".", "--json"], ("{here}",)),
}


@pytest.mark.parametrize("how", list(COMMANDS))
def test_scan_run_from_inside_a_recording_imports_nothing_of_it(crafted: tuple[Path, Path], how: str) -> None:
    folder, markers = crafted
    command, path = COMMANDS[how]
    if not Path(command[0]).exists():
        pytest.skip("no comgra console script in this environment")
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600,
                            env=_environment(*(p.format(here=folder) for p in path)))
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in markers.iterdir()) == [], "a file that came with the recording was imported"
    assert "not reading" in result.stderr and "comgra.toml" in result.stderr  # and says why its settings are unused


def test_the_app_started_inside_a_recording_imports_nothing_of_it(crafted: tuple[Path, Path]) -> None:
    folder, markers = crafted
    process = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "--path", ".", "--port", "0"], cwd=folder,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_environment("."),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (see below)
    try:
        lines = []
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if re.search(r"http://\S+", line) or len(lines) > 50:
                break
        assert any("http://" in line for line in lines), "".join(lines)
    finally:
        process.send_signal(signal.SIGINT)
        # SIGINT as the other tests of the app send it, with its default action restored in the child: a test run
        # started in the background of a shell without job control inherits SIGINT ignored, and a Python started so
        # never turns it into KeyboardInterrupt (the app served on, and the wait timed out).
        try:
            process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()  # reaped and its pipe closed: no ResourceWarning in a later test
            pytest.fail("the app did not exit within 120 s of SIGINT")
    assert sorted(p.name for p in markers.iterdir()) == []


def test_a_detector_a_recording_names_is_refused_even_where_it_is_importable(crafted: tuple[Path, Path],
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """In a process whose sys.path holds the recording (a user's own script), comgra.toml's detectors that
    lie inside a recording are refused before any of their code runs."""
    from comgra.analysis.custom import load_configured
    from comgra.errors import ConfigError

    folder, markers = crafted
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(ConfigError, match="inside the recording"):
        load_configured(["evil:detector"])
    assert "evil" not in sys.modules and sorted(p.name for p in markers.iterdir()) == []


def test_a_comgra_toml_inside_a_recording_is_not_the_user_s_settings(crafted: tuple[Path, Path], tmp_path: Path) -> None:
    folder, _ = crafted
    assert recording_around(folder) == folder.resolve()
    assert recording_around(folder / "trials" / "anything" / "deeper") == folder.resolve()
    ignored = load_settings(cwd=folder)
    assert ignored.ignored == str(folder / "comgra.toml") and ignored.anomalies.detectors == ()
    assert load_settings(folder / "comgra.toml").anomalies.detectors == ("evil:detector",)  # named: read
    own = tmp_path / "project"
    own.mkdir()
    shutil.copy(folder / "comgra.toml", own / "comgra.toml")
    assert recording_around(own) is None
    assert load_settings(cwd=own).anomalies.sensitivity == 50  # the user's own folder: read as before
