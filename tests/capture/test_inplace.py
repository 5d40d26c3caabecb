"""Recorded values are the values at registration, whatever the model does to the tensor afterwards.

In-place activations (``ReLU(inplace=True)``) and residual ``out += identity`` overwrite a tensor
after it was registered; the recording and the dependency graph must still describe the tensor as
it was when it was registered.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from comgra.capture.session import ComgraWarning  # noqa: E402
from comgra.capture.summaries import IMAGE_VALUES, image_shaped  # noqa: E402

MAX_NEURONS = 8
STATISTICS = ("mean", "abs_mean", "std", "min", "max", "abs_max")


# -- expected values, computed with torch from a clone saved at registration ----------------------

def per_sample_expected(value: torch.Tensor, kind: str = "forward") -> dict[str, np.ndarray]:
    """Each statistic per sample, (B,), and the first neurons per sample, (B, MAX_NEURONS); an image-shaped value keeps
    each sample's whole image (capture/summaries.py)."""
    flat = value.detach().double().reshape(value.shape[0], -1)
    whole = flat.shape[1]
    kept = whole if kind == "forward" and image_shaped(tuple(value.shape), 0) and whole <= IMAGE_VALUES else MAX_NEURONS
    return {"mean": flat.mean(1).numpy(), "abs_mean": flat.abs().mean(1).numpy(),
            "std": flat.std(1, unbiased=False).numpy(), "min": flat.amin(1).numpy(), "max": flat.amax(1).numpy(),
            "abs_max": flat.abs().amax(1).numpy(), "neurons": flat[:, :kept].numpy()}


def assert_recorded(trial: Any, name: str, saved: torch.Tensor, training_step: int = 0,
                    kind: str = "forward") -> None:
    """The mean-over-batch row and every per-sample row of ``name`` match ``saved``."""
    rows = [r for r in trial.selection(training_step=training_step, kind=kind).to_pylist()
            if r["tensor_name"] == name]
    expected = per_sample_expected(saved, kind)
    tolerance = 1e-5 * float(saved.abs().max()) + 1e-12  # float32 rounding, at the tensor's own scale
    (mean_row,) = [r for r in rows if r["aggregation"] == "mean"]
    for statistic in STATISTICS:
        assert mean_row[statistic] == pytest.approx(expected[statistic].mean(), rel=1e-5, abs=tolerance), \
            f"{name}: {statistic} of the mean row"
    np.testing.assert_allclose(mean_row["neurons"], expected["neurons"].mean(0), rtol=1e-5, atol=tolerance)
    samples = {r["sample"]: r for r in rows if r["aggregation"] == "sample"}
    assert sorted(samples) == list(range(saved.shape[0]))
    for k, row in samples.items():
        for statistic in STATISTICS:
            assert row[statistic] == pytest.approx(expected[statistic][k], rel=1e-5, abs=tolerance), \
                f"{name}: {statistic} of sample {k}"
        np.testing.assert_allclose(row["neurons"], expected["neurons"][k], rtol=1e-5, atol=tolerance)


def record_one_step(make_recorder: Any, model: nn.Module, run: Any) -> Any:
    """Record training step 0 of ``model``; ``run(recorder)`` does the forward and backward pass."""
    recorder = make_recorder({0}, max_num_neurons_to_record=MAX_NEURONS)
    recorder.track_module("net", model)
    recorder.start_batch(0, run.batch_size)
    recorder.start_iteration()
    result = run(recorder)
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    return result


# -- (a) an activation overwritten in place --------------------------------------------------------

class Batch:
    """A forward pass with a fixed batch size that keeps a clone of what it registers."""

    def __init__(self, batch_size: int, forward: Any):
        self.batch_size, self.forward, self.saved = batch_size, forward, {}

    def __call__(self, recorder: Any) -> dict[str, torch.Tensor]:
        def register(name: str, tensor: torch.Tensor, **kwargs: Any) -> None:
            recorder.register_tensor(name, tensor, **kwargs)
            self.saved[name] = tensor.detach().clone()

        register.connect = recorder.add_tensor_connection  # type: ignore[attr-defined]
        loss = self.forward(register)
        register("loss", loss, is_loss=True)
        loss.backward()
        recorder.record_current_gradients("gradients")
        return self.saved


# 3 x 40 = 120 values (copied at registration) and 2 x 40,000 = 80,000 (summarised at registration).
@pytest.mark.parametrize("batch_size,features", [(3, 40), (2, 40_000)])
@pytest.mark.parametrize("normalization", ["linear", "batchnorm"])
def test_activation_overwritten_by_inplace_relu_is_recorded_as_registered(
        make_recorder, open_trial, generator, batch_size, features, normalization) -> None:
    layer = nn.Linear(4, features) if normalization == "linear" else nn.BatchNorm1d(features)
    model = nn.Sequential(layer)

    def forward(register: Any) -> torch.Tensor:
        x = torch.randn(batch_size, 4 if normalization == "linear" else features, generator=generator)
        register("x", x, is_input=True)
        out = layer(x)
        register("pre_activation", out)
        nn.ReLU(inplace=True)(out)
        assert out.min() >= 0  # the registered tensor really was overwritten
        return out.square().mean()

    saved = record_one_step(make_recorder, model, Batch(batch_size, forward))
    trial = open_trial()
    assert saved["pre_activation"].min() < 0
    assert_recorded(trial, "pre_activation", saved["pre_activation"])
    assert_recorded(trial, "x", saved["x"])
    # The gradient is that of the registered (pre-ReLU) tensor too: value and gradient describe one tensor.
    pre = saved["pre_activation"]
    assert_recorded(trial, "pre_activation", 2 * pre.clamp_min(0) / pre.numel(), kind="gradients")


@pytest.mark.parametrize("batch_size,channels", [(3, 4), (4, 64)])  # 3x4x8x8 copied; 4x64x16x16 summarised at once
def test_batchnorm2d_output_before_inplace_relu(make_recorder, open_trial, generator, batch_size, channels) -> None:
    size = 8 if channels == 4 else 16
    model = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                          nn.ReLU(inplace=True))

    def forward(register: Any) -> torch.Tensor:
        images = torch.randn(batch_size, 3, size, size, generator=generator)
        register("images", images, is_input=True)
        out = model[1](model[0](images))
        register("bn", out)
        model[2](out)
        return out.mean()

    saved = record_one_step(make_recorder, model, Batch(batch_size, forward))
    assert saved["bn"].min() < -1
    assert_recorded(open_trial(), "bn", saved["bn"])


# -- (b) a residual += ------------------------------------------------------------------------------

def test_residual_plus_equals_after_registration(make_recorder, open_trial, generator, edges) -> None:
    model = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))

    def forward(register: Any) -> torch.Tensor:
        x = torch.randn(5, 6, generator=generator)
        register("x", x, is_input=True)
        identity = model[0](x)
        register("identity", identity)
        out = model[1](identity)
        register("out", out)
        out += identity * 10
        register("side", torch.randn(5, 6, generator=generator))
        register.connect("side", out)  # out is known by what it was at registration, not by its new grad_fn
        register("sum", out)
        return out.sum()

    saved = record_one_step(make_recorder, model, Batch(5, forward))
    trial = open_trial()
    assert not torch.allclose(saved["out"], saved["sum"])
    for name in ("x", "identity", "out", "sum"):
        assert_recorded(trial, name, saved[name])
    assert edges(trial, 0, 0) == {
        ("x", "identity"), ("net.0.weight", "identity"), ("net.0.bias", "identity"),
        ("identity", "out"), ("net.1.weight", "out"), ("net.1.bias", "out"), ("side", "out"),
        ("out", "sum"), ("identity", "sum"), ("sum", "loss")}


# -- (c) a ResNet-shaped model ----------------------------------------------------------------------

class BasicBlock(nn.Module):
    """conv-BN-ReLU(inplace)-conv-BN, ``out += identity``, ReLU(inplace): torchvision's shape."""

    def __init__(self, name: str, channels_in: int, channels_out: int, stride: int):
        super().__init__()
        self.name = name
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.downsample = None
        if stride != 1 or channels_in != channels_out:
            self.downsample = nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride, bias=False),
                                            nn.BatchNorm2d(channels_out))

    def forward(self, x: torch.Tensor, register: Any) -> torch.Tensor:
        out = self.bn1(self.conv1(x))
        register(f"{self.name}.bn1", out)
        out = self.relu(out)
        out = self.bn2(self.conv2(out))
        register(f"{self.name}.bn2", out)
        identity = x
        if self.downsample is not None:
            identity = self.downsample(x)
            register(f"{self.name}.downsample", identity)
        out += identity
        out = self.relu(out)
        register(f"{self.name}.out", out)  # the same tensor object as bn2, two in-place ops later
        return out


class TinyResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = BasicBlock("layer1", 16, 16, 1)
        self.layer2 = BasicBlock("layer2", 16, 32, 2)
        self.layer3 = BasicBlock("layer3", 32, 32, 1)
        self.fc = nn.Linear(32, 5)

    def forward(self, images: torch.Tensor, register: Any) -> torch.Tensor:
        x = self.bn1(self.conv1(images))
        register("stem", x)  # 8 x 16 x 32 x 32 = 131,072 values: summarised at registration
        x = self.relu(x)
        for block in (self.layer1, self.layer2, self.layer3):
            x = block(x, register)
        logits = self.fc(x.mean((2, 3)))
        register("logits", logits)
        return logits


def test_resnet_shaped_model_values_edges_and_parameters(make_recorder, open_trial, generator, edges) -> None:
    model = TinyResNet()
    batch_size = 8

    def forward(register: Any) -> torch.Tensor:
        images = torch.randn(batch_size, 3, 32, 32, generator=generator)
        register("images", images, is_input=True)
        logits = model(images, register)
        return logits.logsumexp(1).mean()

    with warnings.catch_warnings():
        warnings.simplefilter("error", ComgraWarning)  # no "has no connection" warning, or any other
        saved = record_one_step(make_recorder, model, Batch(batch_size, forward))
    trial = open_trial()

    for name, value in saved.items():
        if name != "loss":
            assert_recorded(trial, name, value)
    assert saved["stem"].min() < 0 and saved["layer1.bn2"].min() < 0  # the recording shows them before the ReLU

    graph_edges = edges(trial, 0, 0)
    assert {(s, t) for s, t in graph_edges if t.startswith("layer2.")} == {
        ("layer1.out", "layer2.bn1"), ("net.layer2.conv1.weight", "layer2.bn1"),
        ("net.layer2.bn1.weight", "layer2.bn1"), ("net.layer2.bn1.bias", "layer2.bn1"),
        ("layer2.bn1", "layer2.bn2"), ("net.layer2.conv2.weight", "layer2.bn2"),
        ("net.layer2.bn2.weight", "layer2.bn2"), ("net.layer2.bn2.bias", "layer2.bn2"),
        ("layer1.out", "layer2.downsample"), ("net.layer2.downsample.0.weight", "layer2.downsample"),
        ("net.layer2.downsample.1.weight", "layer2.downsample"), ("net.layer2.downsample.1.bias", "layer2.downsample"),
        ("layer2.bn2", "layer2.out"), ("layer2.downsample", "layer2.out"),
    }
    assert {(s, t) for s, t in graph_edges if t.startswith("layer3.")} >= {
        ("layer2.out", "layer3.bn1"), ("layer3.bn2", "layer3.out"), ("layer2.out", "layer3.out")}
    assert {(s, t) for s, t in graph_edges if t == "stem"} == {
        ("images", "stem"), ("net.conv1.weight", "stem"), ("net.bn1.weight", "stem"), ("net.bn1.bias", "stem")}
    assert ("stem", "layer1.bn1") in graph_edges and ("stem", "layer1.out") in graph_edges

    touched = {node for edge in graph_edges for node in edge}
    parameters = {f"net.{name}" for name, _ in model.named_parameters()}
    assert parameters <= touched, f"parameters missing from the graph: {sorted(parameters - touched)}"
    assert set(saved) <= touched
