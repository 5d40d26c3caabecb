"""The CUDA-event path of the profiler, run on CPU with stand-in events: it never synchronises the host.

No GPU here: torch.cuda.Event, the allocator's counters and torch.cuda.synchronize are replaced by
stand-ins that note what is asked of them. The path must record events in the hooks, read them only
once the step's last event reports completion (``query()``, which never blocks), and wait
(``Event.synchronize``) only when the run ends (``take(force=True)``). Proven on hardware: not yet.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parents[1] / "api"))
from profiled_recording import SLEEP_A, nested_model  # noqa: E402

from comgra.profiling.profiler import ProfileOptions, Profiler  # noqa: E402


class StandInEvent:
    """Records the host clock; ``completed`` says whether the 'GPU' has reached it."""

    completed = True
    waits = 0

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.moment: float | None = None

    def record(self, stream: Any = None) -> None:
        self.moment = time.perf_counter()

    def query(self) -> bool:
        return StandInEvent.completed

    def synchronize(self) -> None:
        StandInEvent.waits += 1

    def elapsed_time(self, end: StandInEvent) -> float:
        assert StandInEvent.completed or StandInEvent.waits, "read before the GPU got there"
        return (end.moment - self.moment) * 1000.0  # milliseconds, as torch.cuda.Event answers


@pytest.fixture
def cuda_stand_ins(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"memory_allocated": 0}

    def memory_allocated() -> int:
        calls["memory_allocated"] += 1
        return 1000 * calls["memory_allocated"]

    def no_sync(*_args: Any) -> None:
        raise AssertionError("torch.cuda.synchronize called: the profiler must never wait for the GPU")

    StandInEvent.completed, StandInEvent.waits = True, 0
    monkeypatch.setattr(torch.cuda, "Event", StandInEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    monkeypatch.setattr(torch.cuda, "memory_allocated", memory_allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *_args: 123456)
    return calls


def _step(profiler: Profiler, net: Any, step: int) -> None:
    profiler.start_step(step, detail=True)
    net(torch.randn(3, 4)).pow(2).mean().backward()
    net.zero_grad()
    profiler.finish_step()


def test_events_are_read_only_once_the_gpu_reached_them(cuda_stand_ins: dict[str, int]) -> None:
    net = nested_model()
    profiler = Profiler(ProfileOptions(flops_every=0), cuda=True)
    profiler.add("net", net)
    StandInEvent.completed = False  # the GPU is behind: nothing may be read, nothing may wait
    _step(profiler, net, 0)
    assert profiler.take(force=False, max_age=0.0) is None and profiler.history("net.b1.a") == []
    StandInEvent.completed = True  # it caught up: both steps are read at the next step's end
    _step(profiler, net, 1)
    history = profiler.history("net.b1.a")
    assert [row["training_step"] for row in history] == [0, 1]
    assert StandInEvent.waits == 0 and profiler.error is None
    for row in history:
        assert row["clock"] == "cuda_event"
        assert SLEEP_A <= row["forward_time"] < SLEEP_A + 0.5
        assert row["backward_time"] is not None and row["backward_time"] >= 0
        assert row["cuda_peak"] == 123456 and row["act_mean"] is not None and row["grad_norm"] is not None
        # after - before: the stand-in counter moves by 1000 per reading; net.b1.a's own lin reads it twice inside
        assert row["cuda_allocated_delta"] == 3000
    assert [row["cuda_allocated_delta"] for row in profiler.history("net.b1.a.lin")] == [1000, 1000]
    profiler.close()


def test_only_the_end_of_the_run_waits_for_the_gpu(cuda_stand_ins: dict[str, int]) -> None:
    net = nested_model()
    profiler = Profiler(ProfileOptions(flops_every=0), cuda=True)
    profiler.add("net", net)
    StandInEvent.completed = False
    for step in range(3):
        _step(profiler, net, step)
    assert StandInEvent.waits == 0
    table = profiler.take(force=True)  # the recorder's finalize
    assert StandInEvent.waits == 1  # one wait, on the oldest step's last event; the later ones are behind it
    assert sorted(set(table.column("training_step").to_pylist())) == [0, 1, 2]
    profiler.close()
