"""A custom autograd Function with a known backward time, shared by the profiling tests that check nesting.

    y = SleepInBackward.apply(x, 0.02)   # y equals x; the backward through it sleeps 0.02 s
"""
from __future__ import annotations

import time
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
