"""The bug classes issue 32 found still missed, each written from the bug's public description (not from a test of
ours): a jump on a minority of evaluation passes, and a layer that runs outside autocast."""
from __future__ import annotations

import torch

import comgra
from bugs.harness import NOT_RECORDED, Case, Run, blobs, cross_entropy, mlp


def evaluation_jump_on_some_passes(run: Run, bug: bool) -> None:
    """'Validation loss explodes on some epochs only': two of the validation shards were written without the
    normalisation the others got (raw values 1000 times the standardised ones), met on 2 of the 12 evaluation
    passes; the training data is fine."""
    model = mlp(run, (8, 32, 32, 4))
    batches = blobs(run)
    run.recorder.track_module("model", model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    evaluation_passes = 0
    for step in range(run.steps):
        x, y = batches(step)
        evaluation = step % 5 == 4
        if evaluation:
            evaluation_passes += 1
            if bug and evaluation_passes in (3, 7):  # the unnormalised shards (steps 14 and 34)
                x = x * 1000.0
        model.train(not evaluation)
        with run.step(step, x.shape[0], "evaluation" if evaluation else "train"):
            run.recorder.register_tensor("input", x, is_input=True)
            with torch.set_grad_enabled(not evaluation):
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


class _Classifier(torch.nn.Module):
    def __init__(self, outside: bool) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU())
        self.proj = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 4)
        self.outside = outside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if self.outside:  # "a custom layer wrapped in autocast(enabled=False) for stability, left there"
            with torch.autocast("cpu", enabled=False):
                h = torch.relu(self.proj(h.float()))
        else:
            h = torch.relu(self.proj(h))
        return self.head(h)


def layer_outside_autocast(run: Run, bug: bool) -> None:
    """'Mixed precision gives no speed-up': one projection runs in an autocast(enabled=False) region with its input
    cast to float32 (a numerics workaround copied from a forum answer), so it computes in float32 on every step
    while autocast runs the rest in bfloat16."""
    model = _Classifier(outside=bug)
    batches = blobs(run)
    watch = comgra.watch(model, recorder=run.recorder, name="model")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    try:
        for step in range(run.steps):
            x, y = batches(step)
            with run.step(step, x.shape[0]):
                run.recorder.register_tensor("input", x, is_input=True)
                run.recorder.register_tensor("target", y, is_target=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(x)
                loss = cross_entropy(out.float(), y)
                run.recorder.register_tensor("loss", loss, is_loss=True)
                optimizer.zero_grad()
                loss.backward()
                run.recorder.record_current_gradients("gradients")
            optimizer.step()
    finally:
        watch.remove()


CASES = [
    Case("evaluation_jump_on_some_passes", evaluation_jump_on_some_passes,
         "Forum: validation loss explodes on some epochs only; two validation shards saved without normalisation",
         ("input", "output", "linear0", "linear1", "hidden0", "hidden1"), ("transient_jump",), architecture="MLP"),
    Case("layer_outside_autocast", layer_outside_autocast,
         "Forum: mixed precision gives no speed-up; a layer left in an autocast(enabled=False) region",
         ("model.proj",), ("run_modes",), evidence=NOT_RECORDED, architecture="MLP"),
]


def zero_grad_forgotten_cnn(run: Run, bug: bool) -> None:
    """'Loss goes up after a few iterations' (PyTorch forum): a small CNN trained with SGD and momentum, the loop
    copied from the tutorial without ``optimizer.zero_grad()``: every backward adds to the gradients of all the
    steps before, so the steps grow until the loss jumps up."""
    torch.manual_seed(run.seed)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, 4))
    templates = torch.randn(4, 1, 8, 8, generator=run.generator)
    watch = comgra.watch(model, recorder=run.recorder, name="model")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    try:
        for step in range(run.steps):
            y = run.randint(4, 32)
            x = templates[y] + 0.5 * run.randn(32, 1, 8, 8)
            with run.step(step, 32):
                run.recorder.register_tensor("input", x, is_input=True)
                run.recorder.register_tensor("target", y, is_target=True)
                loss = cross_entropy(model(x), y)
                run.recorder.register_tensor("loss", loss, is_loss=True)
                if not bug:
                    optimizer.zero_grad()
                loss.backward()
                run.recorder.record_current_gradients("gradients")
            optimizer.step()
    finally:
        watch.remove()


CASES.append(Case("zero_grad_forgotten_cnn", zero_grad_forgotten_cnn,
                  "PyTorch forum 'loss goes up after a few iterations': the tutorial loop without optimizer.zero_grad()",
                  ("model.0", "model.3", "model.7"), ("stale_gradient",), architecture="CNN"))


def frozen_body_trained_by_second_optimizer(run: Run, bug: bool) -> None:
    """'Frozen layers still change' (PyTorch forum): the pretrained body is frozen with a parameter group of learning
    rate 0 while the head trains; the auxiliary head's optimizer was built with ``model.parameters()`` (instead of
    the auxiliary head's own), so the body trains through it. The run never calls ``track_optimizer``: the
    optimizers are found through torch's global step hook."""
    model = mlp(run, (8, 32, 32, 4))
    auxiliary = torch.nn.Linear(32, 4)
    batches = blobs(run)
    run.recorder.track_module("model", model)
    body = list(model.layers[0].parameters())
    rest = [p for p in model.parameters() if all(p is not b for b in body)]
    main = torch.optim.AdamW([{"params": body, "lr": 0.0}, {"params": rest}], lr=1e-2)
    aux_optimizer = torch.optim.SGD(list(model.parameters() if bug else []) + list(auxiliary.parameters()), lr=1e-2)
    for step in range(run.steps):
        x, y = batches(step)
        with run.step(step, x.shape[0]):
            run.recorder.register_tensor("input", x, is_input=True)
            run.recorder.register_tensor("target", y, is_target=True)
            features = model.layers[1](model.layers[0](x))
            out = features
            for layer in model.layers[2:]:
                out = layer(out)
            run.recorder.register_tensor("output", out)
            loss = cross_entropy(out, y)
            run.recorder.register_tensor("loss", loss, is_loss=True)
            main.zero_grad()
            aux_optimizer.zero_grad()
            (loss + 0.3 * cross_entropy(auxiliary(features), y)).backward()
            run.recorder.record_current_gradients("gradients")
            main.step()
            aux_optimizer.step()


CASES.append(Case("frozen_body_trained_by_second_optimizer", frozen_body_trained_by_second_optimizer,
                  "PyTorch forum 'frozen layers still change': a second optimizer built with model.parameters()",
                  ("model.layers.0.weight", "model.layers.0.bias"), ("optimizer_groups",), architecture="MLP"))
