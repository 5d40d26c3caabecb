"""Small networks with one planted fault each, recorded with comgra's own recorder."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

GROUP = "group"


class InfiniteGradient(torch.autograd.Function):
    """The identity forward; backward turns every gradient into +inf (a fault of the backward pass only)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


@dataclass
class Network:
    """Blocks run in order; each block's output is registered under its name."""

    blocks: list[tuple[str, nn.Module]]
    inputs: int = 4
    steps: int = 30
    batch: int = 32
    lr: float = 0.05
    adam: bool = False
    target: Callable[[torch.Tensor], torch.Tensor] = field(default=lambda x: x[:, :1] - 0.5 * x[:, 1:2])
    output: Callable[[torch.Tensor], torch.Tensor] | None = None  # a fixed function after the last block
    optimized: Callable[[nn.Module], Any] | None = None  # the parameters the optimizer gets (default: all)
    inject: Callable[[int, str, torch.Tensor], torch.Tensor] | None = None  # before registering a block's output
    after: Callable[[int, str, torch.Tensor], torch.Tensor] | None = None  # after registering it
    extra: Callable[[Any, torch.Tensor], None] | None = None  # register more tensors, given the input


def record(root: Path, trial: str, network: Network, *, seed: int = 0) -> Path:
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(*[block for _, block in network.blocks])
    recorder = ComgraRecorder(root, GROUP, trial, DecisionMakerForRecordingsHardcoded(set(range(network.steps))),
                              max_num_batch_size_to_record=8, flush_seconds=0.05)
    recorder.track_module("model", model)
    parameters = network.optimized(model) if network.optimized else model.parameters()
    optimizer = (torch.optim.Adam if network.adam else torch.optim.SGD)(parameters, lr=network.lr)
    generator = torch.Generator().manual_seed(seed)
    try:
        for step in range(network.steps):
            _step(recorder, model, optimizer, network, step, generator)
            if step == network.steps // 2:
                # At least two chunks whatever the machine's speed (time-based flushes alone give one on a
                # fast machine): the incremental-scan tests need a chunk that comes later.
                recorder.flush()
    finally:
        recorder.finalize()
    return root / GROUP


def _step(recorder: Any, model: nn.Sequential, optimizer: Any, network: Network, step: int,
          generator: torch.Generator) -> None:
    x = torch.randn(network.batch, network.inputs, generator=generator)
    y = network.target(x)
    recorder.start_batch(step, network.batch)
    recorder.start_iteration()
    recorder.register_tensor("input", x, is_input=True)
    h = x
    for (name, _), block in zip(network.blocks, model):
        h = block(h)
        if network.inject is not None:
            h = network.inject(step, name, h)
        recorder.register_tensor(name, h)
        if network.after is not None:
            h = network.after(step, name, h)
    if network.output is not None:
        h = network.output(h)
        recorder.register_tensor("output", h)
    if network.extra is not None:
        network.extra(recorder, x)
    recorder.register_tensor("target", y, is_target=True)
    per_sample = ((h - y) ** 2).mean(dim=1, keepdim=True)
    recorder.register_tensor("loss_per_sample", per_sample)
    loss = per_sample.mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    optimizer.zero_grad()
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    optimizer.step()
    recorder.finish_batch()


def mlp(*sizes: int, activation: Callable[[], nn.Module] = nn.Tanh, last: nn.Module | None = None,
        seed: int = 0) -> list[tuple[str, nn.Module]]:
    """Linear layers with ``activation`` after each but the last, named layer0, layer1, ...

    The weights come from ``seed``, not from the global generator: a test's network must not depend
    on which tests ran before it in the same process.
    """
    blocks: list[tuple[str, nn.Module]] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for index, (a, b) in enumerate(zip(sizes, sizes[1:])):
            is_last = index == len(sizes) - 2
            tail = last if is_last else activation()
            blocks.append((f"layer{index}",
                           nn.Sequential(nn.Linear(a, b), tail) if tail is not None else nn.Linear(a, b)))
    return blocks


def record_dead_and_healthy(root: Path) -> Path:
    """Two trials: ``dead`` (ReLU units with a bias of -20, never active) and ``healthy``."""
    blocks = mlp(4, 16, 1, activation=nn.ReLU)
    with torch.no_grad():
        blocks[0][1][0].bias.fill_(-20.0)
    record(root, "dead", Network(blocks, steps=12))
    return record(root, "healthy", Network(mlp(4, 8, 1), steps=12, lr=0.02))
