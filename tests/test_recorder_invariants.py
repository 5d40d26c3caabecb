"""The recorder never changes training: frozen stays frozen, results are bit-identical, nothing is kept alive."""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader


def make_tiny_model(seed: int = 0, in_features: int = 3, hidden: int = 4, out_features: int = 2) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(in_features, hidden), torch.nn.Tanh(),
                                   torch.nn.Linear(hidden, out_features))


OPTIMIZERS = {
    "sgd_momentum_weight_decay": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam_weight_decay": lambda params: torch.optim.Adam(params, lr=0.01, weight_decay=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01),
}


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_frozen_parameters_stay_frozen_and_unchanged(make_optimizer, make_recorder, record_step, model_forward,
                                                     open_trial, generator) -> None:
    model = make_tiny_model()
    frozen = model[0]
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    before = [p.detach().clone() for p in frozen.parameters()]
    trainable_before = [p.detach().clone() for p in model[2].parameters()]
    optimizer = make_optimizer(model.parameters())  # the frozen ones included, as users often do
    recorder = make_recorder({0, 1, 2, 3})
    recorder.track_module("model", model)
    for step in range(4):
        record_step(recorder, step, 4, model_forward(model, torch.randn(4, 3, generator=generator)),
                    optimizer=optimizer)
    recorder.finalize()

    assert [p.requires_grad for p in frozen.parameters()] == [False, False]
    assert all(p.grad is None for p in frozen.parameters())
    for parameter, original in zip(frozen.parameters(), before):
        assert torch.equal(parameter, original)
    assert any(not torch.equal(p, o) for p, o in zip(model[2].parameters(), trainable_before))

    trial = open_trial()
    for step in range(4):
        gradients = trial.selection(training_step=step, kind="gradients", columns=["node"])
        nodes = set(gradients["node"].to_pylist())
        assert {"model.2.weight", "model.2.bias"} <= nodes
        assert not nodes & {"model.0.weight", "model.0.bias"}  # no gradient row, not a row of zeros
        forward = set(trial.selection(training_step=step, kind="forward", columns=["node"])["node"].to_pylist())
        assert {"model.0.weight", "model.0.bias"} <= forward  # their values are still recorded


def _train(steps: int, recorder: ComgraRecorder | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A recurrent loop with every recorder call; returns every loss and the final parameters."""
    torch.manual_seed(0)
    model = make_tiny_model(seed=3, in_features=3 + 2, hidden=6, out_features=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(7)
    if recorder is not None:
        recorder.track_module("model", model)
    losses = []
    for step in range(steps):
        inputs = torch.randn(3, 5, 3, generator=generator)
        target = torch.randn(5, 2, generator=generator)
        memory = torch.zeros(5, 2)
        if recorder is not None:
            recorder.start_batch(step, 5)
            recorder.register_tensor("initial_memory", memory, is_initial_value=True)
        for iteration in range(3):
            if recorder is not None:
                recorder.start_iteration()
                x = inputs[iteration].clone()
                recorder.register_tensor("x", x, is_input=True)
            else:
                x = inputs[iteration].clone()
            memory = model(torch.cat([x, memory], dim=1)) + torch.nn.functional.dropout(memory, 0.5)
            if recorder is not None:
                recorder.register_tensor("memory", memory)
            if iteration == 2:
                if recorder is not None:  # before its first use, so that the graph sees it
                    recorder.register_tensor("target", target, is_target=True)
                loss = (memory - target).pow(2).mean()
                if recorder is not None:
                    recorder.register_tensor("loss", loss, is_loss=True)
                    recorder.record_kpi_in_graph("loss", "", loss, record_even_if_recording_is_inactive=True)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if recorder is not None:
                    recorder.record_current_gradients("gradients")
            if recorder is not None:
                recorder.finish_iteration()
        if recorder is not None:
            recorder.finish_batch()
        losses.append(loss.detach().clone())
    if recorder is not None:
        recorder.finalize()
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("recorded", [{0, 1, 2, 3, 4, 5}, {1, 4}, set()], ids=["every_step", "some_steps", "none"])
def test_same_losses_and_parameters_with_and_without_the_recorder(recorded, tmp_path: Path) -> None:
    plain_losses, plain_parameters = _train(6, None)
    recorder = ComgraRecorder(tmp_path, "group", "trial", DecisionMakerForRecordingsHardcoded(recorded),
                              flush_seconds=0.05)
    losses, parameters = _train(6, recorder)
    assert all(torch.equal(a, b) for a, b in zip(losses, plain_losses)), (losses, plain_losses)
    assert all(torch.equal(a, b) for a, b in zip(parameters, plain_parameters))
    steps = GroupReader(tmp_path / "group").trial("trial").steps()
    assert set(steps["training_step"].to_pylist()) == recorded


def _step_and_weak_references(recorder, model, step: int) -> dict[str, weakref.ref]:
    """Record one step and return weak references to its tensors.

    Every tensor is a local of this function only, so once it returns nothing of the test holds
    them: whatever is still alive after ``gc.collect()`` is held by the recorder.
    """
    recorder.start_batch(step, 4)
    memory = torch.zeros(4, 2)
    recorder.register_tensor("initial_memory", memory, is_initial_value=True)
    recorder.start_iteration()
    x = torch.randn(4, 3)
    recorder.register_tensor("x", x, is_input=True)
    hidden = model[1](model[0](x))
    recorder.register_tensor("hidden", hidden)
    detached = recorder.detach_while_keeping_connection(hidden)
    y = model[2](detached) + memory
    recorder.register_tensor("y", y)
    y.mul_(1.0)  # an in-place op after registration: the recorder keeps a copy of y and its earlier grad_fn
    unregistered = y * 3
    recorder.add_tensor_connection(hidden, unregistered)
    loss = unregistered.pow(2).mean() + hidden.sum()
    recorder.register_tensor("loss", loss, is_loss=True)
    recorder.record_kpi_in_graph("loss", "", loss, record_even_if_recording_is_inactive=True)
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()
    # The leaves comgra switched requires_grad on for are handed back as they were.
    assert not x.requires_grad and x.grad is None
    assert not memory.requires_grad and memory.grad is None
    tensors = [("memory", memory), ("x", x), ("hidden", hidden), ("detached", detached), ("y", y),
               ("unregistered", unregistered), ("loss", loss), ("detached.grad", detached.grad)]
    references = {name: weakref.ref(t) for name, t in tensors}
    assert all(r() is not None for r in references.values())
    return references


def _alive_after_steps(make_recorder) -> list[list[str]]:
    model = make_tiny_model()
    recorder = make_recorder({0, 1})
    recorder.track_module("model", model)
    alive = []
    for step in range(2):
        references = _step_and_weak_references(recorder, model, step)
        gc.collect()
        alive.append([name for name, r in references.items() if r() is not None])
    recorder.finalize()
    return alive


def test_no_tensor_is_kept_alive_after_a_step(make_recorder, open_trial) -> None:
    assert _alive_after_steps(make_recorder) == [[], []], "still alive after finish_batch"
    assert open_trial().steps().num_rows == 2


def test_a_reference_kept_by_the_recorder_would_be_found(make_recorder, monkeypatch) -> None:
    """The positive control of the test above: a recorder that keeps what it registers is caught."""
    from comgra.capture.step import StepRecording

    kept: list = []
    register = StepRecording.register

    def register_and_keep(self, registration, tensor, **kwargs):
        kept.append((tensor, tensor.grad_fn))
        return register(self, registration, tensor, **kwargs)

    monkeypatch.setattr(StepRecording, "register", register_and_keep)
    for alive in _alive_after_steps(make_recorder):
        assert {"memory", "x", "hidden", "y", "loss"} <= set(alive)


def test_no_tensor_is_kept_alive_after_an_unwanted_dynamic_step(make_recorder) -> None:
    model = make_tiny_model()
    recorder = make_recorder(set())
    recorder.track_module("model", model)
    recorder.start_batch(0, 4, type_of_execution=None)
    recorder.start_iteration()
    x = torch.randn(4, 3)
    recorder.register_tensor("x", x, is_input=True)
    y = model(x)
    recorder.register_tensor("y", y)
    y.sum().backward()
    recorder.finish_iteration()
    recorder.decide_recording_of_batch("main", ["c"] * 4)
    assert not x.requires_grad and x.grad is None  # handed back as it was
    references = [weakref.ref(t) for t in (x, y)]
    del x, y
    gc.collect()
    assert references[1]() is None
    # The input's sentinel (a small CPU tensor) may keep it past finish_batch: an unrecorded step is held, and its
    # sentinels are reduced with the next steps' in one kernel call (breakpoints/sentinels.py, HOLD_STEPS); a flush
    # reads the steps held, and then nothing holds it.
    recorder.finish_batch()
    recorder.flush()
    gc.collect()
    assert all(r() is None for r in references)
