"""``comgra`` and ``comgra demo``: clear messages and exit code 2 for bad input; a fast start."""
from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from comgra.cli import app as cli



@pytest.mark.parametrize("arguments, message", [
    (["--path", "{tmp}/missing"], "does not exist"),
    (["--path", "{tmp}/file.txt"], "is a file"),
    (["--path", "{tmp}"], "holds no comgra recording"),
    (["--path", "{root}"], "is a root folder with groups"),
    (["--path", "{recording}", "--visualization-file", "{tmp}/nope.py"], "visualization file"),
])
def test_bad_input_gets_a_message_and_exit_code_2(tmp_path, recording, capsys, arguments, message):
    (tmp_path / "file.txt").write_text("x")
    values = {"tmp": tmp_path, "root": recording.parent, "recording": recording}
    assert cli.main([a.format(**values) for a in arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error and error.startswith("comgra: error:")


def test_a_newer_format_is_refused_with_a_message(tmp_path, capsys):
    from comgra.store import format as fmt

    fmt.write_json_atomic(fmt.trial_dir(tmp_path, "t") / fmt.TRIAL_META, {"format_version": 99})
    server = cli.check_recording(tmp_path)
    assert server == tmp_path.resolve()  # the app opens; the trial gets a banner there


def test_missing_arguments_are_a_usage_error(capsys):
    assert cli.main([]) == 2
    assert "give the path of a recording" in capsys.readouterr().err


def test_use_path_for_test_run_without_a_test_run(tmp_path, monkeypatch, capsys):
    from comgra.cli import paths

    monkeypatch.setattr(paths, "default_test_run_group_path", lambda: tmp_path / "testcase_for_demonstration")
    assert cli.main(["--use-path-for-test-run"]) == 2
    assert "comgra-test-run" in capsys.readouterr().err


def test_use_path_for_test_run_serves_that_folder(recording, monkeypatch):
    from comgra.cli import paths

    served = {}
    monkeypatch.setattr(paths, "default_test_run_group_path", lambda: recording)
    monkeypatch.setattr(cli, "_run_server", lambda group, **kw: served.update(group=group, **kw) or 0)
    assert cli.main(["--use-path-for-test-run", "--port", "9999"]) == 0
    bundled = cli.bundled_visualization()
    assert served == {"group": recording.resolve(), "host": "127.0.0.1", "port": 9999, "visualization_file": bundled,
                      "allow_hosts": [], "poll_seconds": 2.0, "findings_sensitivity": 1.0,  # [app] refresh_interval_s of comgra.toml
                      "findings_scan": True, "view": "/", "doors": {"token": True, "token_for_reads": False}}
    assert bundled.name == "custom_visualization.py" and "def create_visualization" in bundled.read_text()
    assert cli.main(["--use-path-for-test-run", "--visualization-file", __file__]) == 0  # the user's file wins
    assert served["visualization_file"] == Path(__file__)
    assert cli.main(["--use-path-for-test-run", "--allow-host", "lab.example", "--allow-host", "proxy"]) == 0
    assert served["allow_hosts"] == ["lab.example", "proxy"]
    assert cli.main(["--use-path-for-test-run", "--no-findings-scan"]) == 0
    assert served["findings_scan"] is False
    view = "/?tab=tensors&trial=t&step=40&node=out"  # what 'comgra scan' prints: the address opens this view
    assert cli.main(["--use-path-for-test-run", "--view", view]) == 0
    assert served["view"] == view


def test_a_view_that_is_not_a_view_link_is_a_usage_error(recording, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--path", str(recording), "--view", "http://elsewhere.example/"])
    assert exit_.value.code == 2 and "is not a view link" in capsys.readouterr().err


def test_a_busy_port_is_reported(recording, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["--path", str(recording), "--port", str(port)]) == 2
    assert "try another --port" in capsys.readouterr().err


def test_the_server_starts_binds_localhost_and_stops_cleanly(recording, app_latency):
    """Behaviour only: how fast it starts is benchmarks/server_start.py's figure (a timing bound here was flaky)."""
    process = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "--path", str(recording), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        url = None
        for line in process.stdout:
            match = re.search(r"(http://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url is not None and url.startswith("http://127.0.0.1:") and "?token=" in url  # issue 31 item 5
        with urllib.request.urlopen(url, timeout=60) as response:
            assert response.status == 200
        client = app_latency.DashClient(*app_latency.urllib_transport(url.split("?")[0].rstrip("/")))
        client.trigger("selection.data")
        assert client.statistics()["mean"] is not None
        process.send_signal(signal.SIGINT)  # Ctrl+C
        rest = process.communicate(timeout=10)[0]
        assert process.returncode == 0 and "Traceback" not in rest and "leaked" not in rest, rest
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_help_lists_every_command_and_version_prints_the_version(capsys):
    from comgra._version import __version__

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    help_text = capsys.readouterr().out
    for command in ("demo", "scan", "repair"):
        assert re.search(rf"^\s+comgra {command}\s+\S", help_text, re.MULTILINE), command
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"comgra {__version__}"


def test_an_unknown_command_is_named_not_a_missing_path(capsys):
    assert cli.main(["foo", "--path", "x"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("comgra: error: unknown command 'foo'") and "--path is required" not in error
    assert all(command in error for command in ("demo", "scan", "repair"))
