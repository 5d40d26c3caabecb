"""The one training step that the live tests, the live training script and benchmarks/breakpoints.py share.

    loss, outputs = train_step(recorder, [("hidden", model)], optimizer, x, step)

Every Comgra call of a plain supervised step, in the documented order: the input, each layer's
output under its name, the loss, backward, the gradients, then the optimizer step after
``finish_batch`` (where a breakpoint pauses).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from comgra.recorder import ComgraRecorder

Layer = Callable[[torch.Tensor], torch.Tensor]


def train_step(recorder: ComgraRecorder, layers: Sequence[tuple[str, Layer]], optimizer: torch.optim.Optimizer,
               x: torch.Tensor, step: int, *, target: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One training step on ``x``; returns the loss ((out - target)**2).mean() and each named output."""
    recorder.start_batch(step, x.shape[0])
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    outputs, hidden = {}, x
    for name, layer in layers:
        hidden = outputs[name] = layer(hidden)
        recorder.register_tensor(name, hidden)
    loss = ((hidden - target) ** 2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    optimizer.zero_grad()
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()
    optimizer.step()
    return loss, outputs
