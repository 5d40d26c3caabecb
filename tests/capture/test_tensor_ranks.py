"""Tensors of any rank and dtype are recorded; the original crashed on >= 3 value dimensions."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from comgra.capture.session import ComgraWarning

B = 3
RANKS = {
    # name: (shape, index_of_batch_dimension)
    "per_sample_scalar_1d": ((B,), 0),
    "matrix": ((B, 5), 0),
    "sequence": ((B, 4, 2), 0),
    "conv_feature_map": ((B, 2, 3, 4), 0),
    "video_5d": ((B, 2, 2, 2, 3), 0),
    "time_major_batch_dim_1": ((6, B, 2), 1),
    "batch_last": ((2, 5, B), -1),
}


def _record_one(make_recorder, record_step, open_trial, tensor: torch.Tensor, **register_kwargs):
    recorder = make_recorder({0}, max_num_neurons_to_record=1000)
    record_step(recorder, 0, B, lambda recorder: recorder.register_tensor("t", tensor, **register_kwargs))
    recorder.finalize()
    return open_trial().selection(training_step=0, node="t", kind="forward")


def _by_aggregation(rows) -> dict[tuple[str, int], dict]:
    return {(r["aggregation"], r["sample"]): r for r in rows.to_pylist()}


@pytest.mark.parametrize(("shape", "batch_dim"), RANKS.values(), ids=RANKS.keys())
def test_any_rank_is_recorded_per_sample(shape, batch_dim, make_recorder, record_step, open_trial,
                                         generator) -> None:
    tensor = torch.randn(shape, generator=generator)
    with pytest.warns(ComgraWarning, match="no connection"):  # a lone tensor: a helper value
        rows = _record_one(make_recorder, record_step, open_trial, tensor, index_of_batch_dimension=batch_dim)
    per_sample = np.moveaxis(tensor.detach().numpy(), batch_dim, 0).reshape(B, -1)
    found = _by_aggregation(rows)
    assert set(found) == {("mean", -1), ("std", -1), ("abs_max", -1), *(("sample", k) for k in range(B))}
    for k in range(B):
        row = found[("sample", k)]
        assert row["shape"] == list(shape)
        assert row["num_neurons"] == per_sample.shape[1]
        np.testing.assert_allclose(row["neurons"], per_sample[k], rtol=1e-6)
        np.testing.assert_allclose([row["mean"], row["std"], row["abs_max"]],
                                   [per_sample[k].mean(), per_sample[k].std(), np.abs(per_sample[k]).max()],
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(found[("mean", -1)]["neurons"], per_sample.mean(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(), (1,), (2, 3), (2, 2, 2, 2)], ids=["0d", "1d", "2d", "4d"])
def test_tensor_without_batch_dimension_has_one_row(shape, make_recorder, record_step, open_trial,
                                                    generator) -> None:
    tensor = torch.randn(shape, generator=generator)
    with pytest.warns(ComgraWarning, match="no connection"):
        rows = _record_one(make_recorder, record_step, open_trial, tensor, index_of_batch_dimension=None)
    (row,) = rows.to_pylist()
    assert (row["aggregation"], row["sample"], row["shape"]) == ("none", -1, list(shape))
    np.testing.assert_allclose(row["neurons"], tensor.detach().numpy().reshape(-1), rtol=1e-6)
    assert row["mean"] == pytest.approx(float(tensor.detach().mean()), rel=1e-5, abs=1e-6)


def test_scalar_loss_and_per_sample_loss(make_recorder, record_step, open_trial, generator) -> None:
    model = torch.nn.Linear(2, 1)
    recorder = make_recorder({0})
    recorder.track_module("m", model)
    x = torch.randn(B, 2, generator=generator)
    computed = {}

    def forward(recorder) -> torch.Tensor:
        recorder.register_tensor("x", x, is_input=True)
        computed["per_sample"] = model(x).squeeze(1) ** 2
        recorder.register_tensor("loss_per_sample", computed["per_sample"])
        loss = computed["per_sample"].mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        return loss

    loss = record_step(recorder, 0, B, forward)
    recorder.finalize()
    per_sample = computed["per_sample"]
    trial = open_trial()
    (loss_row,) = trial.selection(training_step=0, node="loss", kind="forward").to_pylist()
    assert (loss_row["aggregation"], loss_row["shape"], loss_row["tensor_type"]) == ("none", [], "loss")
    assert loss_row["mean"] == pytest.approx(loss.item(), rel=1e-6)
    samples = trial.selection(training_step=0, node="loss_per_sample", kind="forward", aggregation="sample")
    assert samples["mean"].to_pylist() == pytest.approx(per_sample.detach().tolist(), rel=1e-6)
    gradient = trial.selection(training_step=0, node="loss_per_sample", kind="gradients", aggregation="sample")
    assert gradient["mean"].to_pylist() == pytest.approx([1 / B] * B, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_and_bool_tensors_are_recorded_as_values_with_one_warning(dtype, make_recorder, record_step,
                                                                          open_trial, generator) -> None:
    values = torch.randint(0, 2 if dtype == torch.bool else 5, (B, 4), generator=generator).to(dtype)
    with pytest.warns(ComgraWarning) as caught:
        rows = _record_one(make_recorder, record_step, open_trial, values)
    advice = [w for w in caught if "add_tensor_connection" in str(w.message)]
    assert len(advice) == 1, [str(w.message) for w in caught]
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert str(dtype) in str(advice[0].message) and "'t'" in str(advice[0].message)
    assert not values.requires_grad
    found = _by_aggregation(rows)
    as_float = values.float().numpy()
    for k in range(B):
        np.testing.assert_array_equal(found[("sample", k)]["neurons"], as_float[k])
    assert found[("mean", -1)]["mean"] == pytest.approx(as_float.mean(), rel=1e-6)


def test_float64_and_float16_are_summarised_in_float32(make_recorder, record_step, open_trial, generator) -> None:
    recorder = make_recorder({0})
    wide = torch.randn(B, 3, generator=generator, dtype=torch.float64)

    def forward(recorder) -> None:
        recorder.register_tensor("wide", wide)
        recorder.register_tensor("narrow", (wide * 2).half())  # computed from wide: connected, no warning

    record_step(recorder, 0, B, forward)
    recorder.finalize()
    rows = open_trial().selection(training_step=0, kind="forward", aggregation="sample", sample=0)
    by_node = {r["node"]: r for r in rows.to_pylist()}
    np.testing.assert_allclose(by_node["wide"]["neurons"], wide[0].detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(by_node["narrow"]["neurons"], wide[0].detach().numpy() * 2, rtol=1e-3)


def test_neurons_are_capped_and_statistics_use_every_value(make_recorder, record_step, open_trial,
                                                           generator) -> None:
    recorder = make_recorder({0}, max_num_neurons_to_record=5)
    fmap = torch.randn(B, 2, 4, 4, generator=generator)
    with pytest.warns(ComgraWarning, match="no connection"):  # at finish_iteration
        record_step(recorder, 0, B, lambda recorder: recorder.register_tensor("fmap", fmap))
    recorder.finalize()
    (row,) = open_trial().selection(training_step=0, node="fmap", aggregation="sample", sample=1).to_pylist()
    flat = fmap[1].detach().reshape(-1).numpy()
    assert row["num_neurons"] == 32
    np.testing.assert_allclose(row["neurons"], flat[:5], rtol=1e-6)
    assert row["max"] == pytest.approx(flat.max(), rel=1e-6)
