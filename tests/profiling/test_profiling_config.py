"""comgra.toml's history and resource keys reach the profiler and the resource sampler; arguments win."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parents[1] / "api"))
from profiled_recording import nested_model  # noqa: E402

from comgra.profiling import resources  # noqa: E402
from comgra.errors import ConfigError  # noqa: E402


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "comgra.toml"
    path.write_text(text)
    return path


def _train(recorder: Any, net: Any, steps: int) -> None:
    for step in range(steps):
        recorder.start_batch(step, 3)
        recorder.start_iteration()
        net(torch.zeros(3, 4)).sum().backward()
        recorder.finish_iteration()
        recorder.finish_batch()


@pytest.mark.parametrize(("argument", "kept"), [(None, [3, 4]), (3, [2, 3, 4])])
def test_layer_executions_bounds_the_history_unless_an_argument_is_given(
        tmp_path: Path, make_recorder: Any, argument: int | None, kept: list[int]) -> None:
    config = _config(tmp_path, "[history]\nlayer_executions = 2\n")
    recorder = make_recorder(steps=set(), resource_seconds=None, config=config, profile_history=argument)
    net = nested_model()
    recorder.track_module("net", net, profile=True)
    _train(recorder, net, 5)
    assert [row["training_step"] for row in recorder.instruments.profiler.history("net.b1.a")] == kept


def test_zero_layer_executions_is_a_config_error_naming_the_key(tmp_path: Path, make_recorder: Any) -> None:
    with pytest.raises(ConfigError, match=r"history\.layer_executions=0"):
        make_recorder(config=_config(tmp_path, "[history]\nlayer_executions = 0\n"))


@pytest.mark.parametrize(("file_interval", "argument", "expected"), [
    (0.25, resources.FROM_CONFIG, 0.25),  # the file decides
    (0.25, 0.5, 0.5),  # the argument wins
    (0.25, None, None),  # None switches sampling off, whatever the file says
    (0, resources.FROM_CONFIG, None),  # 0 in the file: off
])
def test_resource_interval_comes_from_the_file_unless_an_argument_is_given(
        tmp_path: Path, make_recorder: Any, file_interval: float, argument: Any, expected: float | None) -> None:
    config = _config(tmp_path, f"[profiling]\nresource_interval_s = {file_interval}\n")
    kwargs = {} if argument is resources.FROM_CONFIG else {"resource_seconds": argument}
    recorder = make_recorder(config=config, **kwargs)
    sampler = recorder.instruments.sampler
    assert (None if sampler is None else sampler.interval) == expected


def test_without_a_file_the_interval_is_one_second(tmp_path: Path, make_recorder: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no comgra.toml here
    assert make_recorder().instruments.sampler.interval == 1.0


def test_resource_samples_bounds_the_samples_kept_in_memory(tmp_path: Path, make_recorder: Any,
                                                            open_trial: Any) -> None:
    config = _config(tmp_path, "[history]\nresource_samples = 3\n[profiling]\nresource_interval_s = 0.01\n")
    recorder = make_recorder(config=config)
    sampler = recorder.instruments.sampler
    deadline = time.monotonic() + 10
    while len(sampler._rows) < 6 * 5 and time.monotonic() < deadline:  # about 6 samples of 5 metrics
        time.sleep(0.02)
    recorder.finalize()
    recent = sampler.recent()
    stored = open_trial().resources().to_pylist()
    stored_times = sorted({row["wall_time"] for row in stored})
    assert len(stored_times) > 3  # everything sampled is stored; only memory is bounded
    assert sorted({row["wall_time"] for row in recent}) == stored_times[-3:]
    assert len(recent) == sum(1 for row in stored if row["wall_time"] in stored_times[-3:])


def test_a_sampler_keeping_nothing_keeps_nothing() -> None:
    tables: list[Any] = []
    sampler = resources.ResourceSampler(0.01, tables.append, keep=0, batch_seconds=0.0)
    sampler.start()
    time.sleep(0.1)
    sampler.stop()
    assert sum(table.num_rows for table in tables) > 0 and sampler.recent() == []
