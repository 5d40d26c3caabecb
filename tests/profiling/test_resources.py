"""Resource monitoring: samples are stored with the recording; without a GPU the answer says so."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parents[1] / "api"))
from profiled_recording import TRIAL, record  # noqa: E402

from comgra.profiling import resources  # noqa: E402
from comgra.service import RecordingService  # noqa: E402


def _has_gpu() -> bool:
    return resources.GpuProbe.open().handles != []


def test_samples_are_stored_and_served(tmp_path: Path) -> None:
    import psutil

    group = record(tmp_path / "store", steps=3, resource_seconds=0.05)
    service = RecordingService(group)
    try:
        answer = service.resources(TRIAL)
    finally:
        service.close()
    series = {(s["source"], s["metric"]): s for s in answer["series"]}
    assert {("process", "cpu_percent"), ("process", "memory_bytes"), ("machine", "cpu_percent"),
            ("machine", "memory_bytes"), ("machine", "memory_percent")} <= set(series)
    rss = series[("process", "memory_bytes")]["value"]
    assert len(rss) >= 2  # sampled over time, and once more at the end
    # The training process's own memory: between 10 MB and the machine's total.
    assert all(10e6 < value < psutil.virtual_memory().total for value in rss)
    times = series[("process", "memory_bytes")]["wall_time"]
    assert times == sorted(times)
    assert max(series[("process", "memory_bytes")]["training_step"]) == 2  # the last step that started
    if not _has_gpu():
        assert answer["gpu"].startswith("no GPU")
        assert not any(source.startswith("gpu") for source, _ in series)  # no made-up numbers
        assert answer["status"][0]["gpu_count"] == 0


@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU")
def test_no_gpu_is_said_and_never_a_number() -> None:
    probe = resources.GpuProbe.open()
    assert probe.status.startswith("no GPU: ") and probe.sample() == []


def test_sampling_off_records_nothing(tmp_path: Path) -> None:
    group = record(tmp_path / "store", steps=2, resource_seconds=None)
    service = RecordingService(group)
    try:
        answer = service.resources(TRIAL)
    finally:
        service.close()
    assert answer["series"] == [] and answer["status"] == []
    assert not any(t.name == "comgra-resources" for t in __import__("threading").enumerate())


def test_a_sampler_fault_is_reported_once_and_training_goes_on(tmp_path: Path, monkeypatch: Any,
                                                               make_recorder: Any) -> None:
    from comgra.capture.session import ComgraWarning

    def broken(_process: Any) -> Any:
        raise OSError("psutil cannot read /proc")

    monkeypatch.setattr(resources, "cpu_and_memory", broken)
    recorder = make_recorder(steps={0}, resource_seconds=0.01)
    recorder.instruments.sampler._thread.join(5)  # the fault ends the sampler's thread
    with pytest.warns(ComgraWarning, match="resource sampling off.*psutil cannot read"):
        recorder.start_batch(0, 1)
        recorder.finish_batch()
    recorder.start_batch(1, 1)
    recorder.finish_batch()  # no second warning, no exception


@pytest.mark.parametrize("value", [0, -1.0, "1", True])
def test_a_bad_interval_is_a_config_error(make_recorder: Any, value: Any) -> None:
    from comgra.errors import ConfigError

    with pytest.raises(ConfigError, match="resource_seconds"):
        make_recorder(resource_seconds=value)
