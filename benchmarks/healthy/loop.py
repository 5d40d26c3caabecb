"""The training loop the corpus's hand-written runs share: what people write, recorded through ``comgra.watch``
(every module's output) plus the inputs, targets and loss they register themselves."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

GROUP = "healthy"


@dataclass
class Context:
    root: Path
    trial: str
    steps: int = 60
    every: int = 2
    seed: int = 0
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)


@dataclass
class Plan:
    """What one run does besides the forward pass and the loss."""

    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    accumulate: int = 1  # micro-batches per optimizer step
    eval_every: int = 0  # an evaluation pass (model.eval(), no_grad) after every N training steps
    autocast: torch.dtype | None = None
    scaler: Any = None
    clip: float | None = 1.0
    generate: Callable[[torch.nn.Module, Any], None] | None = None  # called in the evaluation passes
    track_optimizer: bool = False
    unrecorded_warmup: int = 0  # steps trained before recording starts ("pretraining")


def recorder_for(ctx: Context, schedule: set[int]) -> Any:
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    return ComgraRecorder(ctx.root, GROUP, ctx.trial, DecisionMakerForRecordingsHardcoded(schedule),
                          max_num_batch_size_to_record=8, resource_seconds=None, flush_seconds=30.0)


def register_batch(recorder: Any, batch: Any) -> None:
    """The inputs and targets a user registers: a tensor pair, or a tokenizer's dict."""
    if isinstance(batch, dict):
        for key, value in batch.items():
            recorder.register_tensor(key, value, is_input=key != "labels", is_target=key == "labels")
    else:
        recorder.register_tensor("input", batch[0], is_input=True)
        recorder.register_tensor("target", batch[1], is_target=True)


def train(ctx: Context, model: torch.nn.Module, batch: Callable[[], Any], loss_of: Callable[[torch.nn.Module, Any], torch.Tensor],
          plan: Plan) -> list[float]:
    import comgra

    for _ in range(plan.unrecorded_warmup):
        plan.optimizer.zero_grad()
        loss_of(model, batch()).backward()
        plan.optimizer.step()
    order = []  # (comgra step number, type) in the order they run
    for step in range(ctx.steps):
        order.append("training")
        if plan.eval_every and step % plan.eval_every == plan.eval_every - 1:
            order.append("evaluation")
    schedule = {n for n, kind in enumerate(order) if kind == "evaluation" or n % ctx.every == 0} | {len(order) - 1}
    recorder = recorder_for(ctx, schedule)
    watch = comgra.watch(model, recorder=recorder)
    if plan.track_optimizer:
        recorder.track_optimizer(plan.optimizer)
    losses = []
    try:
        for number, kind in enumerate(order):
            if kind == "evaluation":
                _evaluate(recorder, number, model, batch(), loss_of, plan)
                continue
            model.train()
            recorder.start_batch(number, _size(batch_now := batch()))
            plan.optimizer.zero_grad()
            for micro in range(plan.accumulate):
                recorder.start_iteration()
                current = batch_now if micro == 0 else batch()
                register_batch(recorder, current)
                with _autocast(plan.autocast):
                    loss = loss_of(model, current) / plan.accumulate
                recorder.register_tensor("loss", loss, is_loss=True)
                (plan.scaler.scale(loss) if plan.scaler else loss).backward()
                if micro == plan.accumulate - 1:
                    if plan.scaler:
                        plan.scaler.unscale_(plan.optimizer)
                    recorder.record_current_gradients("gradients", scaler=plan.scaler)
                recorder.finish_iteration()
            if plan.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), plan.clip)
            if plan.scaler:
                plan.scaler.step(plan.optimizer)
                plan.scaler.update()
            else:
                plan.optimizer.step()
            if plan.scheduler is not None:
                plan.scheduler.step()
            recorder.finish_batch()
            losses.append(float(loss.detach()) * plan.accumulate)
    finally:
        watch.remove()
        recorder.finalize()
    return losses


def _evaluate(recorder: Any, number: int, model: torch.nn.Module, batch: Any, loss_of: Callable, plan: Plan) -> None:
    model.eval()
    with torch.no_grad():
        recorder.start_batch(number, _size(batch), type_of_execution="evaluation")
        recorder.start_iteration()
        register_batch(recorder, batch)
        with _autocast(plan.autocast):
            loss = loss_of(model, batch)
        recorder.register_tensor("loss", loss, is_loss=True)
        if plan.generate is not None:
            plan.generate(model, batch)
        recorder.finish_iteration()
        recorder.finish_batch()
    model.train()


def _autocast(dtype: torch.dtype | None) -> Any:
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _size(batch: Any) -> int:
    return int((next(iter(batch.values())) if isinstance(batch, dict) else batch[0]).shape[0])
