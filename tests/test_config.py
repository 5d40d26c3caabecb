"""comgra.toml: every key checked, unknown keys named, breakpoints from the file reach the run."""
from __future__ import annotations

from pathlib import Path

import pytest

from comgra.config import Settings, load_settings
from comgra.errors import BreakpointError, ConfigError
from comgra.breakpoints import control
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.store import format as fmt

FULL = """
[app]
refresh_interval_s = 5
[anomalies]
sensitivity = 4.5
[history]
layer_executions = 20
resource_samples = 100
[profiling]
enabled = true
flops_every_steps = 10
resource_interval_s = 0.5
[breakpoints]
pause_timeout_s = 30
poll_interval_s = 0.25
sync_every_steps = 2
[[breakpoints.set]]
target = "loss"
condition = "has_nan"
[[breakpoints.set]]
target = "net.b1"
condition = "abs_max > 1e4"
enabled = false
"""


def test_every_setting_is_read(tmp_path: Path) -> None:
    (tmp_path / "comgra.toml").write_text(FULL)
    settings = load_settings(cwd=tmp_path)
    assert settings.app.refresh_interval_s == 5.0 and settings.anomalies.sensitivity == 4.5
    assert (settings.history.layer_executions, settings.history.resource_samples) == (20, 100)
    assert settings.profiling.enabled and settings.profiling.flops_every_steps == 10
    assert settings.breakpoints.pause_timeout == 30.0 and settings.breakpoints.sync_every_steps == 2
    assert settings.breakpoints.set == (
        {"target": "loss", "condition": "has_nan", "enabled": True},
        {"target": "net.b1", "condition": "abs_max > 1e4", "enabled": False})


def test_no_file_gives_the_defaults(tmp_path: Path) -> None:
    assert load_settings(cwd=tmp_path) == Settings()
    assert Settings().breakpoints.pause_timeout is None


@pytest.mark.parametrize("text, words", [
    ("[app]\nrefresh = 1\n", ["'refresh'", "refresh_interval_s"]),
    ("[profile]\nenabled = true\n", ["'profile'", "profiling"]),
    ("[history]\nlayer_executions = -1\n", ["history.layer_executions=-1"]),
    ("[profiling]\nenabled = 1\n", ["profiling.enabled=1", "true or false"]),
    ("[breakpoints]\nset = [{target = 'x', condition = 'x > 1'}]\n", ["unknown name 'x'"]),
    ("[breakpoints]\nset = [{target = 'x', condition = 'has_nan', when = 1}]\n", ["'when'", "condition"]),
    ("[app\n", ["not a readable TOML file"]),
])
def test_bad_keys_and_values_are_named(tmp_path: Path, text: str, words: list[str]) -> None:
    path = tmp_path / "my.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    for word in words:
        assert word in str(caught.value)


def test_a_missing_config_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_the_recorder_starts_with_the_breakpoints_of_its_file_and_arguments(tmp_path: Path) -> None:
    from comgra.recorder import ComgraRecorder

    (tmp_path / "c.toml").write_text(FULL)
    recorder = ComgraRecorder(tmp_path / "root", "g", "t", DecisionMakerForRecordingsHardcoded({0}),
                              config=tmp_path / "c.toml", breakpoints=[{"target": "out", "condition": "mean > 1"}])
    try:
        listed = control.list_breakpoints(fmt.trial_dir(tmp_path / "root" / "g", "t"))
        assert [(b["id"], b["target"], b["enabled"]) for b in listed] == [
            ("bp1", "loss", True), ("bp2", "net.b1", False), ("bp3", "out", True)]
    finally:
        recorder.finalize()
    with pytest.raises(BreakpointError, match="target="):
        ComgraRecorder(tmp_path / "root", "g", "t2", DecisionMakerForRecordingsHardcoded({0}),
                       breakpoints=[{"target": "", "condition": "has_nan"}])


def test_comgra_cli_refuses_a_bad_config_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from comgra.cli.app import main
    from comgra.recorder import ComgraRecorder

    ComgraRecorder(tmp_path / "root", "g", "t", DecisionMakerForRecordingsHardcoded({0})).finalize()
    (tmp_path / "bad.toml").write_text("[app]\nrefresh_seconds = 1\n")
    assert main(["--path", str(tmp_path / "root" / "g"), "--config", str(tmp_path / "bad.toml")]) == 2
    error = capsys.readouterr().err
    assert "'refresh_seconds'" in error and "refresh_interval_s" in error
