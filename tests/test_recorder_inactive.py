"""comgra_is_active=False: every call is a no-op, nothing is written, get_name_of_module still works."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import comgra
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(3, 4)
        self.decoder = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))


def test_inactive_recorder_does_nothing(tmp_path: Path) -> None:
    root = tmp_path / "does_not_exist"
    threads_before = set(threading.enumerate())
    comgra.my_recorder = recorder = ComgraRecorder(
        root, "group", "trial", DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=1),
        comgra_is_active=False)
    model = Net()
    recorder.track_module("main_model", model)
    assert recorder.get_name_of_module(model) == "main_model"
    assert recorder.get_name_of_module(model.decoder[1]) == "main_model.decoder.1"
    recorder.add_note("a note")
    recorder.declare_that_all_different_types_of_execution_have_been_encountered()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in (5, 5, 3):  # not even the step order is checked: every call returns at once
        recorder.start_batch(step, 2, type_of_execution=None)
        assert not recorder.recording_is_active()
        x = torch.ones(2, 3)
        recorder.register_tensor("initial", torch.zeros(2, 4), is_initial_value=True)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        recorder.register_tensor("bad batch size is not checked either", torch.ones(7, 3))
        hidden = model.encoder(x)
        detached = recorder.detach_while_keeping_connection(hidden)
        assert not detached.requires_grad and detached.grad_fn is None
        recorder.add_tensor_connection("x", detached)
        y = model.decoder(hidden)
        loss = y.sum()
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.record_kpi_in_graph("loss", "", loss, record_even_if_recording_is_inactive=True)
        loss.backward()
        optimizer.step()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.decide_recording_of_batch("main", ["a", "b"])
        recorder.finish_batch()
        assert not x.requires_grad  # registered tensors are left alone
    recorder.finalize()
    recorder.finalize()
    assert not root.exists()
    assert list(tmp_path.iterdir()) == []
    assert recorder.session is None
    assert set(threading.enumerate()) <= threads_before  # no writer thread


def test_inactive_recorder_still_rejects_bad_configuration(tmp_path: Path) -> None:
    from comgra.errors import ConfigError

    with pytest.raises(ConfigError, match="trial_id"):
        ComgraRecorder(tmp_path, "group", "", DecisionMakerForRecordingsFrequencyPerType(1), comgra_is_active=False)
