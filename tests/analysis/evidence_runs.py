"""Small real training loops with one bug each (and their fixed twins), recorded with the documented API.

    findings = scan(train(tmp_path, "buggy", bug=dropout_left_on))

A *bug* is a set of callables that change what the loop does at its usual places (the model, the optimizer,
before a step, the evaluation); ``train`` runs 12 training steps of a small MLP with BatchNorm and dropout and
an evaluation pass after every third, recording one step of each type in three.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from comgra.analysis.findings import Finding
from comgra.analysis.scan import Scanner
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder

BATCH = 8


def model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))


@dataclass
class Bug:
    """Where a loop goes wrong (each None: the loop does it right)."""

    optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer] | None = None
    before_step: Callable[[int, torch.nn.Module, torch.optim.Optimizer], None] | None = None
    batch: Callable[[int, torch.Tensor], torch.Tensor] | None = None
    evaluation_batch: Callable[[int, torch.Tensor], torch.Tensor] | None = None  # by the evaluation's number
    evaluate_in_eval_mode: bool = True
    back_to_train_mode: bool = True
    zero_grad_to_none: bool = True


def train(directory: Path, trial: str, bug: Bug, *, steps: int = 12, every: int = 3,
          evaluate_every: int = 3, sentinels: dict[str, Any] | None = None, shared_numbers: bool = False) -> Path:
    """Record one run; returns the group folder. ``shared_numbers``: number the steps as the Hugging Face Trainer's
    callback does (training steps 0, 1, 2, ...; an evaluation after training step g - 1 is step g of type
    "evaluation", beside training step g), else one count of both."""
    net = model()
    optimizer = bug.optimizer(net) if bug.optimizer else torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    recorder = ComgraRecorder(directory, "group", trial,
                              DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=every))
    recorder.track_module("net", net)
    recorder.track_optimizer(optimizer)
    if sentinels is not None:
        recorder.set_sentinels(**sentinels)
    generator = torch.Generator().manual_seed(1)
    step = 0
    for index in range(steps):
        if bug.before_step:
            bug.before_step(index, net, optimizer)
        x, y = torch.randn(BATCH, 4, generator=generator), torch.randn(BATCH, 1, generator=generator)
        x = bug.batch(index, x) if bug.batch else x
        loss = _step(recorder, net, x, y, step, "training")
        optimizer.zero_grad(set_to_none=bug.zero_grad_to_none)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        optimizer.step()
        step += 1
        if (index + 1) % evaluate_every == 0:
            if bug.evaluate_in_eval_mode:
                net.eval()
            with torch.no_grad():
                x, y = torch.randn(BATCH, 4, generator=generator), torch.randn(BATCH, 1, generator=generator)
                x = bug.evaluation_batch(index // evaluate_every, x) if bug.evaluation_batch else x
                _step(recorder, net, x, y, step, "evaluation")
                recorder.finish_iteration()
                recorder.finish_batch()
            step += 0 if shared_numbers else 1
            if bug.back_to_train_mode:
                net.train()
    recorder.finalize()
    return directory / "group"


def _step(recorder: ComgraRecorder, net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, step: int,
          kind: str) -> torch.Tensor:
    recorder.start_batch(step, x.shape[0], type_of_execution=kind)
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    out = net(x)
    recorder.register_tensor("out", out)
    loss = ((out - y) ** 2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    if not torch.is_grad_enabled():  # evaluation under no_grad: autograd shows no edge, so say them
        recorder.add_tensor_connection("x", "out")
        recorder.add_tensor_connection("out", "loss")
    return loss


def scan(group: Path) -> list[Finding]:
    return Scanner().scan(group).findings


def serious(findings: list[Finding], detectors: tuple[str, ...] | None = None) -> list[Finding]:
    """The findings at warning or error (of ``detectors``, if given)."""
    return [f for f in findings if f.severity in ("error", "warning") and (detectors is None or f.detector in detectors)]


EVIDENCE_DETECTORS = ("run_modes", "optimizer_groups", "rank_agreement", "sentinel_events", "profile_spikes")
