"""record_current_gradients under gradient accumulation and loss scaling: one row per key, the last call's
gradients, recorded unscaled (a real torch.amp.GradScaler on CPU, manual scaling), checked against the
gradients this test computes itself with plain autograd, without comgra and without scaling."""
from __future__ import annotations

import collections
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra.capture.session import ComgraWarning
from comgra.errors import RecordingError

MICRO_BATCHES = 3
BATCH = 4


def _model() -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def _data() -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(MICRO_BATCHES, BATCH, 3, generator=generator), torch.randn(MICRO_BATCHES, BATCH, 2,
                                                                                   generator=generator)


def _forward(model: Any, x: Any, y: Any, autocast: Any) -> tuple[Any, Any]:
    with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
        hidden = model[1](model[0](x))
        loss = torch.nn.functional.mse_loss(model[2](hidden).float(), y)
    return hidden, loss


def _expected(autocast: Any = None) -> tuple[list[Any], dict[str, Any], list[dict[str, Any]]]:
    """Plain autograd, no scaling: each micro-batch's hidden gradient, the accumulated parameter gradients,
    and the parameter gradients after each micro-batch."""
    model, (xs, ys) = _model(), _data()
    hidden_grads, after_each = [], []
    for i in range(MICRO_BATCHES):
        hidden, loss = _forward(model, xs[i], ys[i], autocast)
        hidden.retain_grad()
        (loss / MICRO_BATCHES).backward()
        hidden_grads.append(hidden.grad.float().clone())
        after_each.append({name: p.grad.clone() for name, p in model.named_parameters()})
    return hidden_grads, after_each[-1], after_each


def _record(make_recorder: Any, *, scale_loss: Any, record: Any, unscale_before_last: Any = None,
            autocast: Any = None, zero: bool = False) -> Any:
    """One step of MICRO_BATCHES micro-batches, one iteration each, record_current_gradients after each
    backward; ``scale_loss(loss)`` is what is backpropagated, ``record(recorder)`` the call."""
    model, (xs, ys) = _model(), _data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = make_recorder({0})
    recorder.track_module("model", model)
    recorder.start_batch(0, BATCH)
    for i in range(MICRO_BATCHES):
        recorder.start_iteration()
        x = xs[i].clone()
        recorder.register_tensor("x", x, is_input=True)
        hidden, loss = _forward(model, x, ys[i], autocast)
        recorder.register_tensor("hidden", hidden)
        recorder.register_tensor("loss", loss, is_loss=True)
        scale_loss(loss / MICRO_BATCHES).backward()
        if unscale_before_last is not None and i == MICRO_BATCHES - 1:
            unscale_before_last(optimizer)
        record(recorder, zero)
        recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    return optimizer


def _gradient_rows(open_trial: Any) -> list[dict[str, Any]]:
    rows = open_trial().selection(training_step=0).to_pylist()
    keys = collections.Counter((r["kind"], r["iteration"], r["node"], r["role"], r["aggregation"], r["sample"])
                               for r in rows)
    assert [key for key, count in keys.items() if count > 1] == []  # never two rows with one key
    return [r for r in rows if r["kind"] == "gradients"]


def _check(rows: list[dict[str, Any]], hidden_grads: list[Any], parameters: dict[str, Any], rtol: float = 1e-5,
           atol: float = 1e-8) -> None:
    for name, grad in parameters.items():
        (row,) = [r for r in rows if r["node"] == f"model.{name}"]
        assert torch.allclose(torch.tensor(row["neurons"]), grad.flatten(), rtol=rtol, atol=atol), name
    for iteration, grad in enumerate(hidden_grads):
        for sample in range(BATCH):
            (row,) = [r for r in rows if r["node"] == "hidden" and r["iteration"] == iteration
                      and r["aggregation"] == "sample" and r["sample"] == sample]
            assert torch.allclose(torch.tensor(row["neurons"]), grad[sample], rtol=rtol, atol=atol), (iteration, sample)


def _plain(recorder: Any, zero: bool) -> None:
    recorder.record_current_gradients("gradients", zero)


def test_each_tensor_keeps_the_last_calls_gradient(make_recorder: Any, open_trial: Any) -> None:
    """Three calls in one step (one per micro-batch): one row per key, the parameters' accumulated gradient
    (the one SGD applies), each iteration's activation gradient from its own backward pass."""
    hidden_grads, accumulated, after_each = _expected()
    assert not torch.allclose(after_each[0]["0.weight"], accumulated["0.weight"])  # the calls do differ
    optimizer = _record(make_recorder, scale_loss=lambda loss: loss, record=_plain)
    rows = _gradient_rows(open_trial)
    _check(rows, hidden_grads, accumulated)
    weights = [p for group in optimizer.param_groups for p in group["params"]]
    assert torch.equal(weights[0].grad, accumulated["0.weight"])  # what the optimizer would use


def test_zeroed_activation_gradients_keep_the_call_that_had_them(make_recorder: Any, open_trial: Any) -> None:
    """set_gradients_to_zero_if_not_a_parameter: a later call has no gradient for an earlier iteration's
    tensor, which keeps the gradient of the call that had it; the parameters still keep the last call's."""
    hidden_grads, accumulated, _ = _expected()
    _record(make_recorder, scale_loss=lambda loss: loss, record=_plain, zero=True)
    _check(_gradient_rows(open_trial), hidden_grads, accumulated)


@pytest.mark.parametrize("unscale", [None, "unscale_", "step"], ids=["scaled", "after_unscale_", "after_step"])
@pytest.mark.parametrize("autocast", [None, torch.float16], ids=["float32", "autocast_float16"])
def test_a_gradscaler_passed_records_unscaled_gradients(make_recorder: Any, open_trial: Any, unscale: str | None,
                                                        autocast: Any) -> None:
    """A real torch.amp.GradScaler on CPU: the hooks' activation gradients are scaled, the parameters' too
    unless scaler.unscale_ or scaler.step ran (read from the scaler); both are recorded unscaled."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 14)
    hidden_grads, accumulated, _ = _expected(autocast)
    seen: dict[str, Any] = {}

    def unscale_(optimizer: Any) -> None:
        if unscale == "unscale_":
            scaler.unscale_(optimizer)
        else:
            scaler.step(optimizer)  # unscales (in place) and steps; update() comes after the recording
        seen["grad"] = optimizer.param_groups[0]["params"][0].grad.clone()

    _record(make_recorder, scale_loss=scaler.scale, unscale_before_last=unscale_ if unscale else None,
            autocast=autocast, record=lambda recorder, zero: recorder.record_current_gradients(
                "gradients", zero, scaler=scaler))
    if unscale:  # the parameters' .grad were unscaled in place: comgra must not divide them again
        assert torch.allclose(seen["grad"], accumulated["0.weight"], rtol=1e-5)
    # float16 activations: their gradients are float16 values of the scaled loss, as in the test's own run
    _check(_gradient_rows(open_trial), hidden_grads, accumulated, rtol=1e-5 if autocast is None else 2e-3,
           atol=1e-8 if autocast is None else 1e-6)


def test_manual_loss_scaling_with_loss_scale(make_recorder: Any, open_trial: Any) -> None:
    hidden_grads, accumulated, _ = _expected()
    _record(make_recorder, scale_loss=lambda loss: loss * 1024,
            record=lambda recorder, zero: recorder.record_current_gradients("gradients", zero, loss_scale=1024))
    _check(_gradient_rows(open_trial), hidden_grads, accumulated)


def test_a_scale_comgra_cannot_know_is_warned_about(make_recorder: Any, open_trial: Any) -> None:
    """Manual scaling without loss_scale: the registered loss's gradient gives it away (the loss is divided by
    the 3 micro-batches and the result multiplied by 3 * 1024: its gradient is 1024). Recorded as they are,
    with one warning per group that says what to pass."""
    hidden_grads, accumulated, _ = _expected()
    with pytest.warns(ComgraWarning, match=r"The gradient of the loss 'loss' is 1024, not 1: .* "
                                           r"record_current_gradients\('gradients', scaler=<your torch.amp.GradScaler>\)"
                                           r" under AMP, or loss_scale=1024") as caught:
        _record(make_recorder, scale_loss=lambda loss: loss * MICRO_BATCHES * 1024, record=_plain)
    assert len([w for w in caught if issubclass(w.category, ComgraWarning)]) == 1
    scaled = {name: grad * MICRO_BATCHES * 1024 for name, grad in accumulated.items()}
    _check(_gradient_rows(open_trial), [g * MICRO_BATCHES * 1024 for g in hidden_grads], scaled)


def test_loss_scale_1_says_a_weighted_loss_is_meant(make_recorder: Any, open_trial: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _record(make_recorder, scale_loss=lambda loss: loss * MICRO_BATCHES * 16,
                record=lambda recorder, zero: recorder.record_current_gradients("gradients", zero, loss_scale=1))


def test_misuse_names_the_value_and_the_fix(make_recorder: Any) -> None:
    recorder = make_recorder({0})
    recorder.start_batch(0, BATCH)
    recorder.start_iteration()
    with pytest.raises(RecordingError, match=r"scaler='fp16' is not a torch.amp.GradScaler .* loss_scale=<the factor>"):
        recorder.record_current_gradients("gradients", scaler="fp16")
    with pytest.raises(RecordingError, match=r"loss_scale=0 must be a finite number > 0"):
        recorder.record_current_gradients("gradients", loss_scale=0)
    with pytest.raises(RecordingError, match=r"got scaler=.* and loss_scale=2\.0; pass one"):
        recorder.record_current_gradients("gradients", scaler=torch.amp.GradScaler("cpu"), loss_scale=2.0)
    recorder.finish_iteration()
    recorder.finish_batch()


def test_unrecorded_steps_never_read_the_scale(make_recorder: Any) -> None:
    """The scale is a host read (GradScaler.get_scale): on a step that is not recorded nothing is asked."""
    class Watched:
        asked = 0

        def get_scale(self) -> float:
            Watched.asked += 1
            return 4.0

    recorder = make_recorder({1})
    recorder.start_batch(0, BATCH)
    recorder.start_iteration()
    recorder.record_current_gradients("gradients", scaler=Watched())
    recorder.finish_iteration()
    recorder.finish_batch()
    assert Watched.asked == 0
