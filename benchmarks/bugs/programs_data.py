"""Bugs of the data and of the loss's inputs: labels, shapes, scales, batches, evaluation passes."""
from __future__ import annotations

import torch
from torch import nn

from bugs.harness import Case, Run, blobs, cross_entropy, mlp, mse, regression, supervised


def labels_shuffled(run: Run, bug: bool) -> None:
    """Labels shuffled independently of the inputs (two DataLoaders with shuffle=True)."""
    model = mlp(run, (8, 32, 32, 4))
    batches = blobs(run)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batches(step)
        return (x, y[torch.randperm(len(y), generator=run.generator)]) if bug else (x, y)
    supervised(run, model, batch_of, cross_entropy, lr=1e-2)


def target_broadcast(run: Run, bug: bool) -> None:
    """An output of shape (B, 1) against a target of shape (B,): MSE broadcasts to (B, B) (PyTorch only warns)."""
    model = mlp(run, (8, 32, 32, 1))
    batches = regression(run)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batches(step)
        return x, (y[:, 0] if bug else y)
    with _quiet():
        supervised(run, model, batch_of, mse, lr=1e-2)


def mse_on_class_indices(run: Run, bug: bool) -> None:
    """A classifier trained with MSE against class indices (the ported 'numeric label' bug)."""
    model = mlp(run, (8, 32, 32, 4))
    batches = blobs(run)

    def loss_of(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return mse(output, y.float()[:, None].expand_as(output)) if bug else cross_entropy(output, y)
    supervised(run, model, batches, loss_of, lr=1e-2)


def inputs_not_normalised(run: Run, bug: bool) -> None:
    """Raw pixel values 0..255 fed to a tanh network (the ToTensor/Normalize step left out)."""
    model = mlp(run, (16, 32, 32, 4), activation=nn.Tanh)
    batches = blobs(run, features=16)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batches(step)
        pixels = (torch.sigmoid(x) * 255).round()
        return (pixels if bug else pixels / 255 - 0.5), y
    supervised(run, model, batch_of, cross_entropy, lr=1e-3)


def targets_not_normalised(run: Run, bug: bool) -> None:
    """Regression targets in the thousands (prices in dollars) against a network whose output starts near 0."""
    model = mlp(run, (8, 32, 32, 1))
    supervised(run, model, regression(run, scale=3000.0 if bug else 1.0, shift=5000.0 if bug else 0.0), mse,
               optimizer=torch.optim.SGD(model.parameters(), lr=0.01))


def batch_of_one_row(run: Run, bug: bool) -> None:
    """A batch of 1 row instead of 50: x.unsqueeze(0) on a batch that already had its dimension, then [0]."""
    model = mlp(run, (8, 32, 32, 1))
    batches = regression(run, batch=50)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batches(step)
        return (x[:1], y[:1]) if bug else (x, y)
    supervised(run, model, batch_of, mse, lr=1e-2)


def evaluation_pass_blows_up(run: Run, bug: bool) -> None:
    """An evaluation pass on unnormalised data once (a validation set without the training transform)."""
    model = mlp(run, (8, 32, 32, 4))
    batches = blobs(run)
    run.recorder.track_module("model", model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(run.steps):
        x, y = batches(step)
        evaluation = step % 6 == 4
        if evaluation and bug and step == 34:
            x = x * 3000.0
        with run.step(step, x.shape[0], "eval" if evaluation else "train"):
            run.recorder.register_tensor("input", x, is_input=True)
            out = model(x)
            run.recorder.register_tensor("output", out)
            run.recorder.register_tensor("target", y, is_target=True)
            loss = cross_entropy(out, y)
            run.recorder.register_tensor("loss", loss, is_loss=True)
            if not evaluation:
                optimizer.zero_grad()
                loss.backward()
                run.recorder.record_current_gradients("gradients")
        if not evaluation:
            optimizer.step()


def transient_logit_spike(run: Run, bug: bool) -> None:
    """One batch of corrupted inputs (a decoding error in the data pipeline) spikes the activations once."""
    model = mlp(run, (8, 32, 32, 4))
    batches = blobs(run)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batches(step)
        return (x * 1e4 if bug and step == 30 else x), y
    supervised(run, model, batch_of, cross_entropy, lr=1e-2)


def constant_target(run: Run, bug: bool) -> None:
    """The target column read from the wrong field: a constant (an id column filled with one value)."""
    model = mlp(run, (8, 32, 32, 1))
    batches = regression(run)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batches(step)
        return x, (torch.zeros_like(y) if bug else y)
    supervised(run, model, batch_of, mse, lr=1e-2)


def inputs_all_zero(run: Run, bug: bool) -> None:
    """The input tensor zeroed by an in-place op of a transform (x.mul_(mask) with an empty mask)."""
    model = mlp(run, (8, 32, 32, 4))
    batches = blobs(run)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batches(step)
        return (x * 0 if bug else x), y
    supervised(run, model, batch_of, cross_entropy, lr=1e-2)


class _quiet:
    """The broadcast warning of mse_loss is the bug's own, not the benchmark's."""

    def __enter__(self) -> None:
        import warnings

        self.catcher = warnings.catch_warnings()
        self.catcher.__enter__()
        warnings.simplefilter("ignore", UserWarning)

    def __exit__(self, *exc: object) -> None:
        self.catcher.__exit__(*exc)


W = ("model.layers.0.weight", "model.layers.2.weight", "model.layers.4.weight")
CASES = [
    Case("labels_shuffled", labels_shuffled, "Humbatova Training data > Data preprocessing > labels misaligned",
         ("loss", "target"), ("loss_stuck", "loss_not_decreasing"), architecture="MLP"),
    Case("target_broadcast", target_broadcast,
         "PyTorch forum 'Using a target size that is different to the input size' (mse_loss broadcasting)",
         ("output", "target", "loss"), ("shape_mismatch",), architecture="MLP"),
    Case("mse_on_class_indices", mse_on_class_indices, "Humbatova Training > Loss function > wrong loss for the task",
         ("output", "target", "loss"), ("output_range", "loss_stuck", "loss_not_decreasing", "shape_mismatch"),
         architecture="MLP"),
    Case("inputs_not_normalised", inputs_not_normalised, "Humbatova Training data > Preprocessing > missing normalisation",
         ("input", "linear0", "hidden0"), ("saturated_units",), architecture="MLP"),
    Case("targets_not_normalised", targets_not_normalised, "Humbatova Training data > Preprocessing > target scale",
         ("target", "output", "loss"), ("target_scale", "output_range", "loss_diverging", "exploding_gradient",
                                        "non_finite"), architecture="MLP"),
    Case("batch_of_one_row", batch_of_one_row, "A batch of 1 row instead of 50 (issue 24's reproduction)",
         ("input", "output", "target"), ("batch_size",), architecture="MLP"),
    Case("evaluation_pass_blows_up", evaluation_pass_blows_up,
         "Validation data without the training transform; issue 24: logits 2.9e5 in one evaluation pass",
         ("input", "output", "linear0", "linear1", "hidden0", "hidden1"), ("transient_jump",), architecture="MLP"),
    Case("transient_logit_spike", transient_logit_spike, "A corrupted batch (DeepDiagnosis 'unstable activations')",
         ("input", "output", "linear0", "linear1", "hidden0", "hidden1"), ("transient_jump",), architecture="MLP"),
    Case("constant_target", constant_target, "Humbatova Training data > wrong column / constant labels",
         ("target",), ("constant_target",), architecture="MLP"),
    Case("inputs_all_zero", inputs_all_zero, "A transform that zeroes the input (DeepDiagnosis 'no input signal')",
         ("input",), ("constant_input", "loss_stuck"), architecture="MLP"),
]
