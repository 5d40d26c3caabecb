"""Bugs of the model: initialisation, activations, architecture, detached paths."""
from __future__ import annotations

import torch
from torch import nn

from bugs.harness import Case, Named, Run, blobs, cross_entropy, mlp, mse, regression, supervised


def dying_relu_partway(run: Run, bug: bool) -> None:
    """A learning-rate jump partway (a bad schedule) pushes the ReLUs' biases negative: they die and stay dead."""
    model = mlp(run, (8, 64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = blobs(run)

    def kick(step: int) -> None:
        if bug and step == 25:
            with torch.no_grad():
                model.layers[0].bias -= 30.0
    supervised(run, model, batches, cross_entropy, optimizer=optimizer, before_step=kick)


def constant_initialisation(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 4), activation=nn.Tanh)
    if bug:
        with torch.no_grad():
            for layer in (model.layers[0], model.layers[2], model.layers[4]):
                layer.weight.fill_(0.1)
                layer.bias.fill_(0.0)
    supervised(run, model, blobs(run), cross_entropy, lr=1e-2)


def zero_initialisation(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 1), activation=nn.Tanh)
    if bug:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.zero_()
    supervised(run, model, regression(run), mse, optimizer=torch.optim.SGD(model.parameters(), lr=0.05))


def dropout_rate_as_keep_rate(run: Run, bug: bool) -> None:
    """nn.Dropout(p=0.99) where a keep probability of 0.99 was meant (Keras-to-PyTorch port)."""
    model = Named(run, ("linear0", nn.Linear(8, 64)), ("hidden0", nn.ReLU()),
                  ("dropout", nn.Dropout(0.99 if bug else 0.01)), (None, nn.Linear(64, 4)))
    supervised(run, model, blobs(run), cross_entropy, lr=1e-2)


def deep_sigmoid_stack(run: Run, bug: bool) -> None:
    """Eight sigmoid layers; the fix: ReLU with He initialisation."""
    model = mlp(run, (8, 32, 32, 32, 32, 32, 32, 32, 32, 4), activation=nn.Sigmoid if bug else nn.ReLU)
    if not bug:
        _he(model)
    supervised(run, model, blobs(run), cross_entropy, optimizer=torch.optim.SGD(model.parameters(), lr=0.05))


def saturating_tanh_init(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 64, 64, 4), activation=nn.Tanh)
    if bug:
        with torch.no_grad():
            model.layers[0].weight.mul_(40.0)
    supervised(run, model, blobs(run), cross_entropy, lr=1e-3)


def relu_on_regression_output(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 1), last=nn.ReLU() if bug else None)
    supervised(run, model, regression(run), mse, lr=1e-2)


def sigmoid_on_regression_output(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 1), last=nn.Sigmoid() if bug else None)
    supervised(run, model, regression(run, scale=3.0), mse, lr=1e-2)


def softmax_before_cross_entropy(run: Run, bug: bool) -> None:
    """CrossEntropyLoss given probabilities (it applies log_softmax itself)."""
    model = mlp(run, (8, 32, 32, 10), last=nn.Softmax(dim=1) if bug else None)
    supervised(run, model, blobs(run, classes=10), cross_entropy, lr=1e-3)


def sigmoid_twice_with_bce_logits(run: Run, bug: bool) -> None:
    model = mlp(run, (8, 32, 32, 1), last=nn.Sigmoid() if bug else None)
    batches = blobs(run, classes=2)
    supervised(run, model, lambda step: (lambda x, y: (x, y.float()[:, None]))(*batches(step)),
               nn.functional.binary_cross_entropy_with_logits, lr=1e-2)


def accidental_detach(run: Run, bug: bool) -> None:
    encoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    head = nn.Sequential(nn.ReLU(), nn.Linear(16, 4))
    model = nn.ModuleDict({"encoder": encoder, "head": head})

    def forward(x: torch.Tensor) -> torch.Tensor:
        features = encoder(x)
        run.recorder.register_tensor("features", features)
        features = features.detach() if bug else features  # meant for a logged copy, kept in the graph
        return head(features)
    supervised(run, model, blobs(run), cross_entropy, forward=forward, lr=1e-2)


def rnn_hidden_state_explodes(run: Run, bug: bool) -> None:
    """A linear recurrence without a squashing function and with a recurrent weight above 1."""
    cell_in, cell_rec, readout = nn.Linear(4, 16), nn.Linear(16, 16, bias=False), nn.Linear(16, 1)
    with torch.no_grad():
        cell_rec.weight.copy_(torch.eye(16) * (1.5 if bug else 0.5) + 0.01 * torch.randn(16, 16, generator=run.generator))
    model = nn.ModuleList([cell_in, cell_rec, readout])
    run.recorder.track_module("model", model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(run.steps):
        xs = run.randn(20, 16, 4)
        y = xs.sum(dim=(0, 2))[:, None] * 0.1
        run.recorder.start_batch(step, 16, type_of_execution="train")
        h = torch.zeros(16, 16)
        for t in range(20):
            run.recorder.start_iteration()
            run.recorder.register_tensor("input", xs[t], is_input=True)
            h = cell_in(xs[t]) + cell_rec(h) if bug else torch.tanh(cell_in(xs[t]) + cell_rec(h))
            run.recorder.register_tensor("hidden_state", h)
            if t < 19:
                run.recorder.finish_iteration()
        out = readout(h)
        run.recorder.register_tensor("output", out)
        run.recorder.register_tensor("target", y, is_target=True)
        loss = mse(out, y)
        run.recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        run.recorder.record_current_gradients("gradients")
        run.recorder.finish_iteration()
        run.recorder.finish_batch()
        optimizer.step()


def residual_branch_unscaled(run: Run, bug: bool) -> None:
    """A residual branch initialised far too large (a missing 1/sqrt(depth) or zero-init of its last layer)."""
    stem, branch, head = nn.Linear(8, 32), nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32)), nn.Linear(32, 4)
    if bug:
        with torch.no_grad():
            branch[0].weight.mul_(60.0)
            branch[2].weight.mul_(60.0)
    model = nn.ModuleDict({"stem": stem, "branch": branch, "head": head})

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = stem(x)
        run.recorder.register_tensor("stem", h)
        r = branch(h)
        run.recorder.register_tensor("branch", r)
        h = h + r
        run.recorder.register_tensor("block", h)
        return head(torch.relu(h))
    supervised(run, model, blobs(run), cross_entropy, forward=forward, lr=1e-3)


def missing_nonlinearity(run: Run, bug: bool) -> None:
    """Stacked Linear layers without activations cannot learn XOR (the nn.Sequential lost its ReLUs)."""
    model = mlp(run, (2, 32, 32, 2), activation=nn.Identity if bug else nn.ReLU)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.sign(run.randn(64, 2))
        return x + 0.1 * run.randn(64, 2), ((x[:, 0] * x[:, 1]) > 0).long()
    supervised(run, model, batch_of, cross_entropy, lr=1e-2)


def exploding_deep_no_norm(run: Run, bug: bool) -> None:
    """A deep ReLU stack initialised with a gain far too large (std 1 instead of Kaiming); the fix: Kaiming."""
    model = mlp(run, (8, 64, 64, 64, 64, 64, 4))
    if bug:
        with torch.no_grad():
            for layer in model.layers[::2]:
                layer.weight.normal_(0.0, 1.0, generator=run.generator)
    else:
        _he(model)
    supervised(run, model, blobs(run), cross_entropy, optimizer=torch.optim.SGD(model.parameters(), lr=1e-2))


def _he(model: Named) -> None:
    """He (Kaiming) initialisation of every Linear layer: the standard fix of a deep ReLU stack's scale."""
    with torch.no_grad():
        for layer in model.layers:
            if isinstance(layer, nn.Linear):
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu", generator=None)
                layer.bias.zero_()


def log_of_zero_probability(run: Run, bug: bool) -> None:
    """log(softmax) computed by hand instead of log_softmax: probabilities underflow to 0, log gives -inf."""
    model = mlp(run, (8, 32, 32, 4))
    batches = blobs(run, noise=0.1)

    def loss_of(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logp = torch.log(torch.softmax(output * 30, dim=1)) if bug else torch.log_softmax(output * 30, dim=1)
        run.recorder.register_tensor("log_probabilities", logp)
        return nn.functional.nll_loss(logp, y)
    supervised(run, model, batches, loss_of, lr=3e-2)


W0 = ("model.layers.0.weight", "model.layers.0.bias")
CASES = [
    Case("dying_relu_partway", dying_relu_partway, "Humbatova Model > Activation > dying ReLU; AUTOTRAINER 'dying ReLU'",
         ("hidden0", "linear0"), ("dead_units",), architecture="MLP"),
    Case("constant_initialisation", constant_initialisation,
         "Humbatova Model > Weights initialisation > constant init (symmetry not broken)",
         ("hidden0", "hidden1", "linear0", "linear1"), ("identical_units",), architecture="MLP"),
    Case("zero_initialisation", zero_initialisation, "Humbatova Model > Weights initialisation > zero init",
         ("hidden0", "hidden1", "linear0", "linear1", "model.layers.0.weight", "model.layers.2.weight"),
         ("identical_units", "vanishing_gradient", "dead_units"), architecture="MLP"),
    Case("dropout_rate_as_keep_rate", dropout_rate_as_keep_rate,
         "Keras keep_prob ported as PyTorch p (forum threads); Humbatova Model > Layers > dropout", ("dropout",),
         ("dead_units", "sparse_units"), architecture="MLP"),
    Case("deep_sigmoid_stack", deep_sigmoid_stack, "AUTOTRAINER/DeepDiagnosis vanishing gradient",
         ("linear0", "hidden0", "model.layers.0.weight", "model.layers.0.bias", "linear1", "hidden1",
          "model.layers.2.weight"), ("vanishing_gradient",), architecture="deep MLP"),
    Case("saturating_tanh_init", saturating_tanh_init, "AUTOTRAINER 'saturated activation'; Humbatova Weights init",
         ("hidden0", "linear0"), ("saturated_units",), architecture="MLP"),
    Case("relu_on_regression_output", relu_on_regression_output,
         "Humbatova Model > Activation > wrong activation on the output layer", ("output", "model.layers.4"),
         ("one_sided", "output_range"), architecture="MLP"),
    Case("sigmoid_on_regression_output", sigmoid_on_regression_output,
         "Humbatova Model > Activation > wrong activation on the output layer", ("output",),
         ("output_range", "saturated_units"), architecture="MLP"),
    Case("softmax_before_cross_entropy", softmax_before_cross_entropy,
         "PyTorch forum 'softmax before CrossEntropyLoss'; Humbatova Training > Loss function",
         ("output", "loss"), ("probabilities_to_logit_loss", "loss_not_decreasing", "loss_stuck"), architecture="MLP"),
    Case("sigmoid_twice_with_bce_logits", sigmoid_twice_with_bce_logits,
         "BCEWithLogitsLoss on sigmoid outputs (PyTorch forum); Humbatova Training > Loss function",
         ("output", "loss"), ("probabilities_to_logit_loss", "loss_not_decreasing", "loss_stuck"), architecture="MLP"),
    Case("accidental_detach", accidental_detach, "'.detach() breaks the graph' (PyTorch forum); Humbatova Model > Layers",
         ("encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias", "features",
          "model.encoder.0.weight", "model.encoder.0.bias", "model.encoder.2.weight", "model.encoder.2.bias"),
         ("accidental_detach",), architecture="MLP"),
    Case("rnn_hidden_state_explodes", rnn_hidden_state_explodes,
         "Humbatova Model > Layers > RNN without squashing; exploding hidden state (forum threads)", ("hidden_state",),
         ("growth_within_step", "growth", "exploding_gradient"), architecture="RNN"),
    Case("residual_branch_unscaled", residual_branch_unscaled,
         "Residual branch initialised too large (Fixup / zero-init of the last layer in a block)", ("branch",),
         ("growth_along_edge",), architecture="residual MLP"),
    Case("missing_nonlinearity", missing_nonlinearity, "Humbatova Model > Activation > missing activation",
         ("loss", "hidden0", "hidden1"), ("loss_not_decreasing", "loss_stuck"), architecture="MLP"),
    Case("exploding_deep_no_norm", exploding_deep_no_norm,
         "AUTOTRAINER/DeepDiagnosis exploding gradient; Humbatova Weights initialisation",
         ("output", "linear4", "hidden4", "linear3", "hidden3", "model.layers.10.weight"),
         ("growth_along_edge", "exploding_gradient", "growth", "non_finite", "loss_diverging"), architecture="deep MLP"),
    Case("log_of_zero_probability", log_of_zero_probability,
         "torch.log(softmax(x)) instead of log_softmax (PyTorch forum 'nan loss'); DeepDiagnosis numerical error",
         ("log_probabilities",), ("non_finite",), architecture="MLP"),
]
