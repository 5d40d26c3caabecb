"""Bugs whose evidence comgra does not record yet (module modes, dtypes, optimizer groups, every-step
sentinels): counted apart from the targets, so that what they need is visible."""
from __future__ import annotations

import torch
from torch import nn

from bugs.harness import NOT_RECORDED, Case, Named, Run, blobs, cross_entropy, mlp, supervised


def _train_and_evaluate(run: Run, model: nn.Module, *, evaluation_mode: bool) -> None:
    batches = blobs(run)
    run.recorder.track_module("model", model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(run.steps):
        x, y = batches(step)
        evaluation = step % 5 == 4
        model.train(not (evaluation and evaluation_mode))
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


def dropout_left_on_in_evaluation(run: Run, bug: bool) -> None:
    model = Named(run, ("linear0", nn.Linear(8, 64)), ("hidden0", nn.ReLU()), ("dropout", nn.Dropout(0.5)),
                  (None, nn.Linear(64, 4)))
    _train_and_evaluate(run, model, evaluation_mode=not bug)


def batchnorm_in_training_mode_in_evaluation(run: Run, bug: bool) -> None:
    model = Named(run, ("linear0", nn.Linear(8, 64)), ("norm", nn.BatchNorm1d(64)), ("hidden0", nn.ReLU()),
                  (None, nn.Linear(64, 4)))
    _train_and_evaluate(run, model, evaluation_mode=not bug)


def frozen_stage_trains(run: Run, bug: bool) -> None:
    """requires_grad=False set on the head instead of the pretrained body, which was meant to stay frozen."""
    model = mlp(run, (8, 32, 32, 4))
    frozen = model.layers[4] if bug else model.layers[0]
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    supervised(run, model, blobs(run), cross_entropy,
               optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2))


def model_cast_to_half_partway(run: Run, bug: bool) -> None:
    """A checkpoint reload partway that casts the model to bfloat16 (and the inputs with it)."""
    model = mlp(run, (8, 32, 32, 4))
    batches = blobs(run)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batches(step)
        if bug and step >= 30:
            model.to(torch.float64)
            return x.to(torch.float64), y
        return x, y
    supervised(run, model, batch_of, lambda o, y: cross_entropy(o.float(), y),
               optimizer=torch.optim.SGD(model.parameters(), lr=0.05))


def nan_on_unrecorded_steps(run: Run, bug: bool) -> None:
    """A rare corrupted batch (NaN in the data) on steps the policy does not record; the optimizer skips nothing."""
    model = mlp(run, (8, 32, 32, 4))
    batches = blobs(run)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batches(step)
        if bug and step in (17, 41):
            x = x.clone()
            x[0, 0] = float("inf")
        return x, y
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    supervised(run, model, batch_of, cross_entropy, optimizer=optimizer,
               after_backward=lambda step: [p.grad.nan_to_num_(0.0, 0.0, 0.0) for p in model.parameters()])


CASES = [
    Case("dropout_left_on_in_evaluation", dropout_left_on_in_evaluation,
         "model.eval() forgotten before validation (PyTorch forum); needs each module's train/eval mode",
         ("dropout",), ("module_mode",), evidence=NOT_RECORDED, architecture="MLP"),
    Case("batchnorm_in_training_mode_in_evaluation", batchnorm_in_training_mode_in_evaluation,
         "BatchNorm in training mode during evaluation (PyTorch forum); needs module modes",
         ("norm",), ("module_mode",), evidence=NOT_RECORDED, architecture="MLP+BatchNorm"),
    Case("frozen_stage_trains", frozen_stage_trains,
         "requires_grad set on the wrong stage (fine-tuning threads); needs requires_grad and optimizer groups",
         ("model.layers.0.weight", "model.layers.0.bias"), ("frozen_stage_trains",), evidence=NOT_RECORDED,
         architecture="MLP"),
    Case("model_cast_to_half_partway", model_cast_to_half_partway,
         "dtype changed partway (mixed-precision threads, PyTorch and DeepSpeed trackers); needs dtypes",
         ("input", "output"), ("dtype_change",), evidence=NOT_RECORDED, architecture="MLP"),
    Case("nan_on_unrecorded_steps", nan_on_unrecorded_steps,
         "Rare NaN/Inf batches between recorded steps (issue 24: 11 faulty steps, 2 recorded); needs sentinels",
         ("input",), ("sentinel",), evidence=NOT_RECORDED, architecture="MLP"),
]
