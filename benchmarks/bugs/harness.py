"""What a benchmark case is, and the recording boilerplate every program shares.

A program is a function ``program(run, bug)``: it builds a small model, trains it for ``run.steps``
steps on CPU and records it through ``run.recorder`` (a real ``ComgraRecorder``) as a user would:
``track_module``, ``register_tensor`` of inputs, outputs, targets, the loss and a few hidden tensors,
``record_current_gradients``. ``bug=False`` is the fixed twin (the same program with the bug removed).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

GROUP = "bugs"
# Where the evidence of a bug lies. "recorded": in what comgra records today (values, gradients, parameters,
# shapes, graphs): the targets are counted over these. "not_recorded": it needs evidence comgra does not record
# yet (module modes, dtypes, autocast, optimizer groups, every-step sentinels, rank comparison): counted apart.
RECORDED, NOT_RECORDED = "recorded", "not_recorded"


@dataclass(frozen=True)
class Case:
    """One program of the benchmark and its ground truth."""

    name: str
    program: Callable[[Run, bool], None]
    source: str  # where the bug comes from: an issue thread or the class of a published taxonomy
    nodes: tuple[str, ...] = ()  # the node(s) or parameter(s) where the bug shows; a finding on one is right
    symptoms: tuple[str, ...] = ()  # the detectors whose finding names the mechanism
    evidence: str = RECORDED
    healthy: bool = False  # a healthy control (no bug): any warning is a false alarm
    twin: bool = True  # program(run, False) is a meaningful fixed twin
    architecture: str = ""


@dataclass
class Run:
    """The recorder of one trial and the loop's boilerplate."""

    recorder: Any
    steps: int
    seed: int = 0
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    @contextlib.contextmanager
    def step(self, step: int, batch_size: int, type_of_execution: str = "train") -> Iterator[None]:
        """One recorded training step of one iteration: start_batch ... finish_batch."""
        self.recorder.start_batch(step, batch_size, type_of_execution=type_of_execution)
        self.recorder.start_iteration()
        yield
        self.recorder.finish_iteration()
        self.recorder.finish_batch()

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator)

    def randint(self, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=self.generator)

    def register(self, **tensors: torch.Tensor) -> None:
        """Hidden tensors, by name."""
        for name, tensor in tensors.items():
            self.recorder.register_tensor(name, tensor)


def record(root: Path, case: Case, bug: bool, *, steps: int = 60, record_every: int = 2, seed: int = 0) -> str:
    """Record one program into ``root/GROUP`` as trial ``<name>`` or ``<name>__fixed``; returns the trial."""
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    trial = case.name if bug or case.healthy else f"{case.name}__fixed"
    torch.manual_seed(seed)
    recorded = set(range(0, steps, record_every)) | {steps - 1}
    recorder = ComgraRecorder(root, GROUP, trial, DecisionMakerForRecordingsHardcoded(recorded), max_num_batch_size_to_record=8,
                              resource_seconds=None, flush_seconds=30.0)
    try:
        case.program(Run(recorder, steps, seed), bug)
    finally:
        recorder.finalize()
    return trial


# -- the loop most programs share ----------------------------------------------------------------------------

def supervised(run: Run, model: nn.Module, batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
               loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
               optimizer: torch.optim.Optimizer | None = None, lr: float = 1e-2,
               forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
               zero_grad: bool = True, before_step: Callable[[int], None] | None = None,
               after_backward: Callable[[int], None] | None = None, name: str = "model") -> list[float]:
    """A plain supervised loop: batch, forward (registering ``output``), loss, backward, step."""
    run.recorder.track_module(name, model)
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(run.steps):
        x, y = batches(step)
        with run.step(step, x.shape[0]):
            run.recorder.register_tensor("input", x, is_input=True)
            output = forward(x) if forward is not None else model(x)
            run.recorder.register_tensor("output", output)
            run.recorder.register_tensor("target", y, is_target=True)
            loss = loss_of(output, y)
            run.recorder.register_tensor("loss", loss, is_loss=True)
            if zero_grad:
                optimizer.zero_grad()
            loss.backward()
            if after_backward is not None:
                after_backward(step)
            run.recorder.record_current_gradients("gradients")
        if before_step is not None:
            before_step(step)
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def blobs(run: Run, classes: int = 4, features: int = 8, batch: int = 32, noise: float = 0.5
          ) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """A learnable classification task: Gaussian blobs around fixed centres."""
    centres = torch.randn(classes, features, generator=run.generator) * 2

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = run.randint(classes, batch)
        return centres[y] + noise * run.randn(batch, features), y
    return batch_of


def regression(run: Run, features: int = 8, outputs: int = 1, batch: int = 32, scale: float = 1.0,
               shift: float = 0.0) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """A learnable regression task: a fixed smooth function of the inputs."""
    weight = torch.randn(features, outputs, generator=run.generator) / features ** 0.5

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = run.randn(batch, features)
        return x, scale * (torch.tanh(x @ weight) + 0.3 * (x @ weight)) + shift
    return batch_of


class Named(nn.Module):
    """Layers run in order; the output of each named one is registered (the hidden tensors)."""

    def __init__(self, run: Run, *layers: tuple[str | None, nn.Module]) -> None:
        super().__init__()
        self.run_ = run
        self.names = [name for name, _ in layers]
        self.layers = nn.ModuleList([layer for _, layer in layers])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, layer in zip(self.names, self.layers):
            x = layer(x)
            if name is not None:
                self.run_.recorder.register_tensor(name, x)
        return x


def mlp(run: Run, sizes: tuple[int, ...], activation: Callable[[], nn.Module] = nn.ReLU,
        last: nn.Module | None = None) -> Named:
    """Linear layers; each hidden activation registered as hidden<i>, the pre-activations as linear<i>."""
    layers: list[tuple[str | None, nn.Module]] = []
    for index, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append((f"linear{index}" if index < len(sizes) - 2 else None, nn.Linear(a, b)))
        if index < len(sizes) - 2:
            layers.append((f"hidden{index}", activation()))
    if last is not None:
        layers.append((None, last))
    return Named(run, *layers)


def cross_entropy(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, y)


def mse(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, y)
