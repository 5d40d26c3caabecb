"""Gradients under gradient accumulation and loss scaling: which call of a step is kept, and what the
recorded gradients are divided by.

Several ``record_current_gradients`` calls of one step with the same group name (one per micro-batch of
gradient accumulation) keep, for each tensor, its gradient at the last call in which it had one: for the
parameters, the accumulated gradient the optimizer uses. The earlier rows are dropped, so that no key
(step, iteration, tensor, group, sample) is written twice.

Under loss scaling (``torch.amp.GradScaler``, or ``(loss * 1024).backward()`` by hand) every gradient the
backward pass makes is the true one times the scale. The gradients comgra's hooks catch during the backward
pass (those of registered tensors) are scaled, always; the parameters' ``.grad`` are scaled until
``scaler.unscale_(optimizer)`` (or ``scaler.step``) divides them. ``scale_of`` reads which is which from the
scaler the user passes, and the recorded gradients are divided accordingly (in float32: a float16 gradient
divided by 65536 in float16 would lose its small values).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch

from comgra.capture.summaries import Block
from comgra.errors import RecordingError

# A registered loss whose gradient is a power of two of at least this is taken for a scaled loss (GradScaler's
# scales are powers of two, 65536 at the start; manual scaling uses 128 ... 65536). A loss weighted by 2 or 4
# on purpose stays below it.
SUSPICIOUS_LOSS_GRADIENT = 8.0


@dataclass(frozen=True)
class GradientScale:
    """What a ``record_current_gradients`` call divides the gradients by: ``activations`` (the gradients of
    registered tensors, caught during the backward pass), ``parameters`` (their ``.grad`` now: 1 where the
    scaler unscaled them already). ``known``: the caller said (``scaler=`` or ``loss_scale=``); unknown, a
    registered loss's gradient is checked for a scale nobody mentioned."""

    activations: float = 1.0
    parameters: float = 1.0
    known: bool = False


NOT_GIVEN = GradientScale()


def scale_of(scaler: Any, loss_scale: Any) -> GradientScale:
    """The scale of a ``record_current_gradients(..., scaler=..., loss_scale=...)`` call; raises
    RecordingError on a value that cannot be a scale."""
    if scaler is not None and loss_scale is not None:
        raise RecordingError(f"record_current_gradients got scaler={scaler!r} and loss_scale={loss_scale!r}; pass "
                             "one: scaler=<the torch.amp.GradScaler> under AMP, loss_scale=<the factor> for a loss "
                             "you multiplied yourself.")
    if loss_scale is not None:
        value = float(loss_scale) if isinstance(loss_scale, torch.Tensor) and loss_scale.numel() == 1 else loss_scale
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
            raise RecordingError(f"loss_scale={loss_scale!r} must be a finite number > 0: the factor the loss was "
                                 "multiplied by before backward() (1: not scaled).")
        return GradientScale(float(value), float(value), known=True)
    if scaler is None:
        return NOT_GIVEN
    if not callable(getattr(scaler, "get_scale", None)):
        raise RecordingError(f"scaler={scaler!r} is not a torch.amp.GradScaler (it has no get_scale()); pass the "
                             "scaler whose scale(loss) was backpropagated, or loss_scale=<the factor> for manual "
                             "loss scaling.")
    is_enabled = getattr(scaler, "is_enabled", None)
    if callable(is_enabled) and not is_enabled():
        return GradientScale(1.0, 1.0, known=True)
    scale = float(scaler.get_scale())
    # GradScaler's stage per optimizer it has seen since update(): UNSCALED (unscale_ ran) or STEPPED (step ran),
    # both with the .grad unscaled in place. It knows no optimizer before unscale_ or step, so with several
    # optimizers the user unscales all of them or none before this call (README). update() forgets the stages
    # and may change the scale: the gradients are recorded before it.
    states = getattr(scaler, "_per_optimizer_states", None) or {}
    if any(getattr(state.get("stage"), "name", "READY") in ("UNSCALED", "STEPPED") for state in states.values()):
        return GradientScale(scale, 1.0, known=True)
    return GradientScale(scale, scale, known=True)


def unscaled(grad: torch.Tensor, divisor: float) -> torch.Tensor:
    """``grad / divisor``, in float32 for a half-precision gradient; ``grad`` itself for a divisor of 1."""
    if divisor == 1.0:
        return grad
    if grad.dtype in (torch.float16, torch.bfloat16):
        grad = grad.float()
    return grad / divisor


def suspected_scale(losses: list[tuple[str, torch.Tensor]]) -> tuple[str, float] | None:
    """(name, scale) of a registered loss whose gradient betrays a scale (a power of two of at least
    SUSPICIOUS_LOSS_GRADIENT), or None. Called only on recorded steps where no scale was given: one host read
    per loss."""
    for name, grad in losses:
        if grad.numel() != 1 or not grad.is_floating_point():
            continue
        value = abs(float(grad.detach().reshape(())))
        if value >= SUSPICIOUS_LOSS_GRADIENT and math.isfinite(value) and math.log2(value).is_integer():
            return name, value
    return None


def warning_of_unknown_scale(kind: str, loss_name: str, value: float) -> str:
    return (f"The gradient of the loss {loss_name!r} is {value:g}, not 1: the loss was multiplied by {value:g} before "
            f"backward() (loss scaling), so the gradients recorded as {kind!r} are {value:g} times their true values. "
            f"Pass record_current_gradients({kind!r}, scaler=<your torch.amp.GradScaler>) under AMP, or "
            f"loss_scale={value:g} for a loss you scaled yourself, to record them unscaled; pass loss_scale=1 if the "
            "loss is weighted so on purpose.")


def supersede(blocks: list[Any], kind: str, keys: set[tuple[int, str]]) -> list[Any]:
    """``blocks`` with the earlier gradients of ``keys`` in group ``kind`` marked superseded (their rows are not
    written); a block left with none of its own is dropped."""
    if not keys:
        return blocks
    kept = []
    for block in blocks:
        if isinstance(block, Block) and block.kind == kind:
            block.superseded.update(r.key for r in block.registrations if r.key in keys)
            if len(block.superseded) == len(block.registrations):
                continue
        kept.append(block)
    return kept
