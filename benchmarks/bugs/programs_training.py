"""Bugs of the training procedure: the optimizer, the learning rate, gradients, updates."""
from __future__ import annotations

import torch
from torch import nn

from bugs.harness import Case, Run, blobs, cross_entropy, mlp, mse, regression, supervised

W = ("model.layers.0.weight", "model.layers.2.weight", "model.layers.4.weight",
     "model.layers.0.bias", "model.layers.2.bias", "model.layers.4.bias")


def missing_zero_grad(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    supervised(run, model, blobs(run), cross_entropy, optimizer=optimizer, zero_grad=not bug)


def learning_rate_too_high(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 1))
    supervised(run, model, regression(run), mse, optimizer=torch.optim.SGD(model.parameters(), lr=2.0 if bug else 0.05))


def learning_rate_too_low(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 4))
    supervised(run, model, blobs(run), cross_entropy, lr=1e-6 if bug else 1e-2)


def zero_grad_between_backward_and_step(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    supervised(run, model, blobs(run), cross_entropy, optimizer=optimizer,
               before_step=(lambda step: optimizer.zero_grad()) if bug else None)


def head_left_out_of_optimizer(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 4))
    body = [p for name, p in model.named_parameters() if not name.startswith("layers.4")]
    supervised(run, model, blobs(run), cross_entropy,
               optimizer=torch.optim.Adam(body if bug else model.parameters(), lr=1e-2))


def schedule_to_zero_partway(run: Run, bug: bool) -> None:
    """LambdaLR meant as a warm-up whose lambda returns 0 after it (the fix: a decay that stays positive)."""
    model = mlp(run, (8, 32, 32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step < 20) * 1 if bug else max(0.2, 1 - step / 60))
    supervised(run, model, blobs(run), cross_entropy, optimizer=optimizer, after_backward=lambda step: None,
               before_step=lambda step: scheduler.step() if step > 0 else None)


def stage_stops_partway(run: Run, bug: bool) -> None:
    """A stage's parameters are re-assigned to a new optimizer partway, without the first layer."""
    model = mlp(run, (8, 32, 32, 4))
    holder = {"optimizer": torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)}
    batches = blobs(run)

    def swap(step: int) -> None:
        if step == 25:
            kept = list(model.layers[2:].parameters()) if bug else list(model.parameters())
            holder["optimizer"] = torch.optim.SGD(kept, lr=0.05, momentum=0.9)
    run.recorder.track_module("model", model)
    for step in range(run.steps):
        swap(step)
        x, y = batches(step)
        with run.step(step, x.shape[0]):
            run.recorder.register_tensor("input", x, is_input=True)
            out = model(x)
            run.recorder.register_tensor("output", out)
            run.recorder.register_tensor("target", y, is_target=True)
            loss = cross_entropy(out, y)
            run.recorder.register_tensor("loss", loss, is_loss=True)
            holder["optimizer"].zero_grad()
            loss.backward()
            run.recorder.record_current_gradients("gradients")
        holder["optimizer"].step()


def gradient_clipped_to_nothing(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    supervised(run, model, blobs(run), cross_entropy, optimizer=optimizer,
               after_backward=lambda step: nn.utils.clip_grad_norm_(model.parameters(), 1e-5 if bug else 5.0))


def loss_summed_over_large_batch(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 1))
    supervised(run, model, regression(run, batch=256), lambda o, y: nn.functional.mse_loss(
        o, y, reduction="sum" if bug else "mean"), optimizer=torch.optim.SGD(model.parameters(), lr=0.05))


def weight_decay_too_strong(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 4))
    supervised(run, model, blobs(run), cross_entropy,
               optimizer=torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=5.0 if bug else 1e-4))


def loss_sign_flipped(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 4))
    supervised(run, model, blobs(run), lambda o, y: (-1 if bug else 1) * cross_entropy(o, y), lr=1e-2)


def stale_gradients_reused(run: Run, bug: bool) -> None:
    """Adam without zero_grad: each step's gradient is the sum of every earlier one."""
    model = mlp(run, (8, 32, 32, 4))
    supervised(run, model, blobs(run), cross_entropy, lr=3e-3, zero_grad=not bug)


CASES = [
    Case("missing_zero_grad", missing_zero_grad,
         "PyTorch forum 'Why do we need to call zero_grad()'; Humbatova et al. Training > Optimiser",
         W, ("stale_gradient", "update_ratio", "exploding_gradient", "growth"), architecture="MLP"),
    Case("stale_gradients_adam", stale_gradients_reused,
         "Gradient accumulation whose reset is never reached (transformers and Lightning forum threads on accumulation); AUTOTRAINER oscillating loss",
         W, ("stale_gradient", "update_ratio"), architecture="MLP"),
    Case("learning_rate_too_high", learning_rate_too_high,
         "Humbatova et al. Training > Hyperparameters > learning rate too high; AUTOTRAINER 'exploding'",
         (*W, "loss", "output"), ("loss_diverging", "update_ratio", "exploding_gradient", "growth", "non_finite",
                                  "dead_units"), architecture="MLP"),
    Case("learning_rate_too_low", learning_rate_too_low,
         "Humbatova et al. Training > Hyperparameters > learning rate too low; DeepDiagnosis 'slow convergence'",
         (*W, "loss"), ("update_ratio", "loss_not_decreasing"), architecture="MLP"),
    Case("zero_grad_between_backward_and_step", zero_grad_between_backward_and_step,
         "PyTorch forum 'model does not learn, zero_grad after backward'; Humbatova Training > Optimiser",
         W, ("parameter_not_updated",), architecture="MLP"),
    Case("head_left_out_of_optimizer", head_left_out_of_optimizer,
         "PyTorch forum 'layer not in optimizer param groups'; Humbatova Training > Optimiser",
         ("model.layers.4.weight", "model.layers.4.bias"), ("parameter_not_updated",), architecture="MLP"),
    Case("schedule_to_zero_partway", schedule_to_zero_partway,
         "LambdaLR returning an int 0 after warm-up (PyTorch forum 'LambdaLR sets lr to zero')",
         W, ("parameter_stopped",), architecture="MLP"),
    Case("stage_stops_partway", stage_stops_partway,
         "Optimizer rebuilt partway from a subset of the parameters (staged fine-tuning threads, PyTorch forum)",
         ("model.layers.0.weight", "model.layers.0.bias"), ("parameter_stopped",), architecture="MLP"),
    Case("gradient_clipped_to_nothing", gradient_clipped_to_nothing,
         "clip_grad_norm_ with max_norm far too small; Humbatova Training > Hyperparameters",
         (*W, "loss"), ("update_ratio", "loss_not_decreasing"), architecture="MLP"),
    Case("loss_summed_over_large_batch", loss_summed_over_large_batch,
         "reduction='sum' where 'mean' was meant (PyTorch forum); Humbatova Training > Loss function",
         (*W, "loss", "output"), ("update_ratio", "loss_diverging", "exploding_gradient", "growth", "non_finite",
                                  "dead_units"), architecture="MLP"),
    Case("weight_decay_too_strong", weight_decay_too_strong,
         "Humbatova et al. Training > Hyperparameters > regularisation too strong",
         (*W, "loss"), ("parameter_shrinking", "loss_not_decreasing", "collapse", "update_ratio"), architecture="MLP"),
    Case("loss_sign_flipped", loss_sign_flipped,
         "Humbatova et al. Training > Loss function > wrong loss (maximised instead of minimised)",
         ("loss", "output"), ("loss_diverging", "growth"), architecture="MLP"),
]
