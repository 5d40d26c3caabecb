"""Complex tensors are recorded as their magnitudes |z|: every statistic and the first values, for the values
and the gradients, never the real part alone (the imaginary part was dropped in silence before: abs_mean 1.3175
where the mean of |z| is 2.1519), with one warning per tensor name that says so. Checked on the one-pass C
kernel (capture/fused.py) and on the eager path that ``COMGRA_FUSED_KERNEL=0`` gives."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from comgra.capture import fused  # noqa: E402
from comgra.capture.session import ComgraWarning  # noqa: E402

BATCH = 4
STATISTICS = ("mean", "abs_mean", "std", "min", "max", "abs_max")


@pytest.fixture(params=["kernel", "COMGRA_FUSED_KERNEL=0"])
def statistics_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The one-pass kernel, built, or the eager path as the environment switch leaves it."""
    monkeypatch.setattr(fused, "_BUILD", fused._new_build())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if request.param == "kernel":
        monkeypatch.delenv("COMGRA_FUSED_KERNEL", raising=False)
        if not fused.ensure_built():
            pytest.skip("no C compiler here: there is no kernel (the eager path is the other parameter)")
    else:
        monkeypatch.setenv("COMGRA_FUSED_KERNEL", "0")
        assert not fused.ensure_built()
    return str(request.param)


class ComplexLayer(torch.nn.Module):
    """x -> (x @ W) * exp(i phase): a complex activation from a complex parameter, then a real loss of it."""

    def __init__(self, width: int, generator: torch.Generator) -> None:
        super().__init__()
        real, imaginary = torch.randn(2, width, width, generator=generator)
        self.weight = torch.nn.Parameter(torch.complex(real, imaginary) / width ** 0.5)
        self.phase = torch.nn.Parameter(torch.randn(width, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.complex64) @ self.weight) * torch.polar(torch.ones_like(self.phase), self.phase)


def _rows(trial: Any, step: int, name: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in trial.selection(training_step=step, kind=kind).to_pylist() if r["tensor_name"] == name]


def _assert_magnitudes(rows: list[dict[str, Any]], value: torch.Tensor, batch_dim: int | None, neurons: int) -> None:
    """Each recorded row against |value| as the test computes it: per sample, or the whole tensor."""
    magnitude = value.detach().abs().double()
    if batch_dim is None:
        (row,) = rows
        expected = [(row, magnitude.reshape(-1))]
    else:
        samples = {r["sample"]: r for r in rows if r["aggregation"] == "sample"}
        assert sorted(samples) == list(range(BATCH))
        expected = [(samples[i], magnitude[i].reshape(-1)) for i in range(BATCH)]
    for row, z in expected:
        reference = [z.mean(), z.mean(), z.std(unbiased=False), z.min(), z.max(), z.max()]
        assert [row[k] for k in STATISTICS] == pytest.approx([float(v) for v in reference], rel=1e-5, abs=1e-6)
        assert row["nan_count"] == 0 and row["inf_count"] == 0
        np.testing.assert_allclose(row["neurons"], z[:neurons].numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("width", [6, 20_000])  # 20,000 x 4 samples: summarised at registration, in the kernel
def test_complex_values_and_gradients_are_recorded_as_magnitudes(statistics_path: str, make_recorder: Any,
                                                                  open_trial: Any, generator: torch.Generator,
                                                                  width: int) -> None:
    x = torch.randn(BATCH, width, generator=generator)
    z = torch.complex(torch.randn(BATCH, width, generator=generator), torch.randn(BATCH, width, generator=generator))
    z = z.requires_grad_(True)
    layer = ComplexLayer(8, generator)
    h = torch.randn(BATCH, 8, generator=generator)
    recorder = make_recorder({0, 1}, max_num_neurons_to_record=5,
                             calculate_svd_and_other_expensive_operations_of_parameters=True)
    recorder.track_module("layer", layer)
    seen: dict[tuple[int, str], torch.Tensor] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (0, 1):
            recorder.start_batch(step, BATCH)
            recorder.start_iteration()
            recorder.register_tensor("z", z)
            scaled = z * (1.5 - 0.5j)
            recorder.register_tensor("scaled", scaled)
            scaled.register_hook(lambda grad, step=step: seen.__setitem__((step, "scaled"), grad))
            out = layer(h)
            recorder.register_tensor("out", out)
            out.register_hook(lambda grad, step=step: seen.__setitem__((step, "out"), grad))
            loss = (scaled.abs() * x).mean() + (out.real ** 2 + out.imag).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            layer.zero_grad()
            loss.backward()
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            recorder.finish_batch()
            seen[(step, "z")], seen[(step, "weight")] = z.grad.clone(), layer.weight.grad.clone()
            seen[(step, "value out")] = out.detach().clone()
            z.grad = None
    recorder.finalize()
    trial = open_trial()
    for step in (0, 1):
        _assert_magnitudes(_rows(trial, step, "z", "forward"), z, 0, 5)
        _assert_magnitudes(_rows(trial, step, "scaled", "forward"), z * (1.5 - 0.5j), 0, 5)
        _assert_magnitudes(_rows(trial, step, "out", "forward"), seen[(step, "value out")], 0, 5)
        _assert_magnitudes(_rows(trial, step, "layer.weight", "forward"), layer.weight, None, 5)
        _assert_magnitudes(_rows(trial, step, "z", "gradients"), seen[(step, "z")], 0, 5)
        _assert_magnitudes(_rows(trial, step, "scaled", "gradients"), seen[(step, "scaled")], 0, 5)
        _assert_magnitudes(_rows(trial, step, "out", "gradients"), seen[(step, "out")], 0, 5)
        _assert_magnitudes(_rows(trial, step, "layer.weight", "gradients"), seen[(step, "weight")], None, 5)
        # the singular value of the complex matrix itself, not of |W| nor of its real part
        (weight_row,) = _rows(trial, step, "layer.weight", "forward")
        assert weight_row["svd_max"] == pytest.approx(float(torch.linalg.matrix_norm(layer.weight.detach(), ord=2)),
                                                      rel=1e-5)
    # the case: abs_mean is the mean of |z|, not of |Re z|
    (batch_mean,) = [r for r in _rows(trial, 0, "z", "forward") if r["aggregation"] == "mean"]
    per_sample = z.detach().abs().double().reshape(BATCH, -1).mean(1)
    assert batch_mean["abs_mean"] == pytest.approx(float(per_sample.mean()), rel=1e-5)
    assert batch_mean["abs_mean"] != pytest.approx(float(z.detach().real.abs().double().reshape(BATCH, -1).mean(1).mean()),
                                                   rel=1e-3)
    notices = [str(w.message) for w in caught if issubclass(w.category, ComgraWarning) and "complex" in str(w.message)]
    assert sorted(n.split("'")[1] for n in notices) == ["layer.weight", "out", "scaled", "z"], notices
    assert all("|z|" in n and "view_as_real" in n for n in notices)
    assert not [w for w in caught if "discards the imaginary part" in str(w.message)]  # torch's own cast warning


def test_comgra_watch_records_a_complex_module_output(make_recorder: Any, open_trial: Any,
                                                      generator: torch.Generator) -> None:
    """A module that returns a complex tensor is watched like any other (it was skipped as if it were token ids)."""
    import comgra

    layer = ComplexLayer(8, generator)
    h = torch.randn(BATCH, 8, generator=generator)
    recorder = make_recorder({0}, max_num_neurons_to_record=5)
    seen: dict[str, torch.Tensor] = {}
    with comgra.watch(layer, recorder=recorder, name="layer"), pytest.warns(ComgraWarning, match="complex"):
        recorder.start_batch(0, BATCH)
        recorder.start_iteration()
        out = layer(h)
        out.register_hook(lambda grad: seen.__setitem__("grad", grad))
        loss = (out.real ** 2 + out.imag).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    trial = open_trial()
    _assert_magnitudes(_rows(trial, 0, "layer", "forward"), out, 0, 5)
    _assert_magnitudes(_rows(trial, 0, "layer", "gradients"), seen["grad"], 0, 5)
