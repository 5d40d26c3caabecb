"""A fault of comgra's own is reported once, stops the recording, and never stops the training."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from comgra.capture.session import ComgraWarning
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder
from comgra.store import format as fmt
from comgra.store import encoding as chunk_encoding


def _train(recorder: ComgraRecorder, model: torch.nn.Module, steps: range, *, notes: bool = False) -> list[float]:
    """A full training loop with every recorder call; returns the losses."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder.track_module("model", model)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for step in steps:
        x = torch.randn(4, 3, generator=generator)
        recorder.start_batch(step, 4)
        recorder.start_iteration()
        if notes:
            recorder.add_note(f"step {step}")
        recorder.register_tensor("x", x, is_input=True)
        y = model(x)
        recorder.register_tensor("y", y)
        recorder.add_tensor_connection("x", y)
        y2 = recorder.detach_while_keeping_connection(y) * 1.0
        loss = (y2.sum() - 1) ** 2 + y.pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.record_kpi_in_graph("loss", "train", loss.detach(), record_even_if_recording_is_inactive=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        losses.append(loss.item())
    recorder.finalize()
    return losses


def test_root_path_below_a_file_warns_once_and_training_goes_on(tmp_path: Path, tiny_model) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    def make_and_train() -> tuple[ComgraRecorder, list[float]]:
        recorder = ComgraRecorder(blocker / "root", "group", "trial", DecisionMakerForRecordingsHardcoded({0, 1, 2}))
        return recorder, _train(recorder, tiny_model, range(5))

    with pytest.warns(ComgraWarning) as caught:
        recorder, losses = make_and_train()
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert str(blocker) in message and "training goes on" in message and "comgra_root_path" in message
    assert len(losses) == 5
    assert not recorder.recording_is_active()
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("flush_seconds", [0.0, 60.0], ids=["flushed_during_training", "flushed_at_finalize"])
def test_failing_chunk_writer_warns_once_and_stops_recording(flush_seconds: float, make_recorder, store_root,
                                                            monkeypatch, tiny_model) -> None:
    def disk_full(*arguments: object) -> None:  # every Parquet chunk the writer encodes
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(chunk_encoding, "_encode", disk_full)
    recorder = make_recorder(set(range(20)), flush_seconds=flush_seconds)
    with pytest.warns(ComgraWarning) as caught:
        losses = _train(recorder, tiny_model, range(20), notes=True)  # finalize() included
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "No space left on device" in str(caught[0].message)
    assert len(losses) == 20
    assert recorder.session is not None and recorder.session.broken
    trial_dir = store_root / "group" / "trials" / "trial"
    assert not list((store_root / "group" / "tensors").rglob("*.parquet"))


def test_fault_found_in_the_middle_of_a_step_does_not_reach_the_training(make_recorder, monkeypatch,
                                                                          tiny_model) -> None:
    """The writer fails in the background; the next put (a note, mid-step) finds out."""
    def disk_full(*arguments: object) -> None:  # every Parquet chunk the writer encodes
        raise OSError(28, "No space left on device")

    recorder = make_recorder({0, 1}, flush_seconds=0.0)
    model = tiny_model
    recorder.track_module("model", model)
    recorder.add_note("before")
    recorder.session.writer.flush()
    monkeypatch.setattr(chunk_encoding, "_encode", disk_full)
    recorder.add_note("this one fails on the writer thread")
    recorder.session.writer.flush()
    recorder.start_batch(0, 2)
    recorder.start_iteration()
    x = torch.ones(2, 3)
    recorder.register_tensor("x", x, is_input=True)
    with pytest.warns(ComgraWarning, match="No space left"):
        recorder.add_note("the fault is reported here")
    y = model(x)
    recorder.register_tensor("y", y)  # must not raise
    recorder.add_tensor_connection("x", y)
    z = recorder.detach_while_keeping_connection(y)
    loss = z.sum() + y.sum()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()
    recorder.record_current_gradients("gradients")
    assert not recorder.recording_is_active()
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()


def test_internal_error_in_capture_is_reported_once(make_recorder, monkeypatch, tiny_model) -> None:
    from comgra.capture import step as step_module

    def broken(self, *args, **kwargs):
        raise ZeroDivisionError("a bug in comgra")

    monkeypatch.setattr(step_module.StepRecording, "finish_iteration", broken)
    recorder = make_recorder({0, 1, 2})
    with pytest.warns(ComgraWarning) as caught:
        losses = _train(recorder, tiny_model, range(3))
    assert len(caught) == 1 and "ZeroDivisionError: a bug in comgra" in str(caught[0].message)
    assert len(losses) == 3


def test_removing_the_trial_folder_mid_run_is_reported_once_and_nothing_is_recreated(make_recorder, store_root,
                                                                                      tiny_model) -> None:
    import shutil

    recorder = make_recorder(set(range(40)), flush_seconds=0.0)
    trial_dir = store_root / "group" / "trials" / "trial"
    with pytest.warns(ComgraWarning) as caught:
        optimizer_steps = _train_until(recorder, tiny_model, 20, after=lambda: shutil.rmtree(trial_dir))
    assert optimizer_steps == 40
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "removed or replaced" in str(caught[0].message) and str(trial_dir) in str(caught[0].message)
    assert recorder.session is not None and recorder.session.broken
    assert not trial_dir.exists(), "the writer recreated the removed trial folder"


def _train_until(recorder: ComgraRecorder, model: torch.nn.Module, cut: int, after) -> int:
    """40 recorded steps; ``after`` runs once all of the first ``cut`` steps are on disk."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder.track_module("model", model)
    done = 0
    for step in range(40):
        if step == cut:
            recorder.session.writer.flush()
            after()
        recorder.start_batch(step, 4)
        recorder.start_iteration()
        x = torch.randn(4, 3)
        recorder.register_tensor("x", x, is_input=True)
        loss = model(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        done += 1
    recorder.finalize()
    return done


def test_a_faulted_writer_leaves_no_thread_behind(tmp_path: Path, monkeypatch) -> None:
    import threading

    import pyarrow as pa

    from comgra.store.writer import ChunkWriter

    def disk_full(*arguments: object) -> None:  # every Parquet chunk the writer encodes
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(chunk_encoding, "_encode", disk_full)
    before = set(threading.enumerate())
    writer = ChunkWriter(tmp_path / "trial", flush_seconds=60.0, max_queued_items=2)
    writer.put_table("notes", pa.table({"seq": [1], "wall_time": [0.0], "note": ["x"]}, schema=fmt.NOTES_SCHEMA))
    writer.flush(timeout=5)
    assert isinstance(writer.error, OSError)
    for _ in range(10):  # a full queue after the fault must not block the training thread
        writer.put_table("notes", pa.table({"seq": [1], "wall_time": [0.0], "note": ["x"]}, schema=fmt.NOTES_SCHEMA))
    writer.close(timeout=5)
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=2)
        assert not thread.is_alive(), f"{thread.name} still runs after the writer faulted and closed"
