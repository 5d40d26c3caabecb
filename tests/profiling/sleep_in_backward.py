"""What the profiling tests that check nesting share: a custom autograd Function with a known backward
time, and the profiled training loop that times each step's passes itself.

    y = SleepInBackward.apply(x, 0.02)   # y equals x; the backward through it sleeps 0.02 s
    rows, forward_walls, backward_walls = profiled_steps(net, folder, steps=2)
    rows, _, _ = profiled_steps(net, folder, steps=2, marker="python")  # the Python hook as the backward marker
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch


class SleepInBackward(torch.autograd.Function):
    """The identity forward; its backward sleeps a known time."""

    @staticmethod
    def forward(ctx: Any, x: Any, seconds: float) -> Any:
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        time.sleep(ctx.seconds)
        return grad, None


def profiled_steps(net: torch.nn.Module, folder: Path, steps: int, *, marker: str = "native"
                   ) -> tuple[list[dict[str, Any]], list[float], list[float]]:
    """The layers rows of ``steps`` steps of ``net`` tracked with profile=True (input ones(2, 4), loss the
    mean square of its output), and the wall time of each step's forward and backward pass. ``marker``:
    "native" (the C++ backward marker, built first; the Python hook where no compiler can build it) or
    "python" (the Python hook)."""
    from comgra.profiling import native_marker
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    if marker == "native":
        native_marker.ensure_built()
    recorder = ComgraRecorder(folder, f"group-{marker}", "trial", DecisionMakerForRecordingsHardcoded({0}),
                              resource_seconds=None)
    recorder.track_module("net", net, profile=True)
    recorder.instruments.profiler._marks.native_allowed = marker == "native"
    forward_walls, backward_walls = [], []
    for step in range(steps):
        recorder.start_batch(step, 2)
        recorder.start_iteration()
        start = time.perf_counter()
        loss = net(torch.ones(2, 4)).pow(2).mean()
        forward_walls.append(time.perf_counter() - start)
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.finish_iteration()
        start = time.perf_counter()
        loss.backward()
        backward_walls.append(time.perf_counter() - start)
        recorder.finish_batch()
    profiler = recorder.instruments.profiler
    rows = [row for name in profiler.layer_names for row in profiler.history(name)]
    recorder.finalize()
    return rows, forward_walls, backward_walls
