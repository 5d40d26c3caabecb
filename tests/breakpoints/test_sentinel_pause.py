"""A sentinel's error pauses the run like a breakpoint when asked (``set_sentinels(pause_on_error=True)``): the
step with the first NaN stops at its finish_batch, its sentinel rows are readable while it waits, and the
control channel's continue lets it go on (issue 24, item 6). Without the option the run never pauses."""
from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path

import pytest
import torch

from comgra.breakpoints import control
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader

NAN_STEP = 5


def _train(root: Path, pause: bool, progress: list[int]) -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    recorder = ComgraRecorder(root, "group", "trial", DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=100))
    recorder.track_module("net", net)
    recorder.set_sentinels(pause_on_error=pause)
    for step in range(8):
        x = torch.randn(4, 3)
        if step == NAN_STEP:
            x[0, 0] = math.nan
        recorder.start_batch(step, 4)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        loss = net(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.finish_iteration()
        recorder.finish_batch()
        progress.append(step)
    recorder.finalize()


def _wait(condition, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_first_nan_pauses_its_step_until_continue(tmp_path: Path) -> None:
    progress: list[int] = []
    thread = threading.Thread(target=_train, args=(tmp_path, True, progress), daemon=True)
    thread.start()
    trial_dir = tmp_path / "group" / "trials" / "trial"
    try:
        state = _wait(lambda: (s := control.run_state(trial_dir)).get("state") == "paused" and s)
        assert state["training_step"] == NAN_STEP and state["breakpoint"] == "sentinel-nan"
        assert state["reason"] == "breakpoint" and state["hits"] == {"sentinel-nan": 1}
        time.sleep(0.3)
        assert progress == list(range(NAN_STEP))  # paused means paused: the NaN step has not finished
        rows = GroupReader(tmp_path / "group").trial("trial").evidence("sentinels").to_pylist()
        assert [(r["training_step"], r["event"]) for r in rows if r["name"] == "loss"][-1] == (NAN_STEP, "nan")
        control.send_command(trial_dir, "continue")
        thread.join(60)
        assert not thread.is_alive() and progress == list(range(8))
    finally:
        if thread.is_alive():
            control.send_command(trial_dir, "abort")
            thread.join(60)


def test_without_pause_on_error_the_run_goes_on_and_says_it_once(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    progress: list[int] = []
    with caplog.at_level(logging.WARNING, logger="comgra.sentinels"):
        _train(tmp_path, False, progress)
    assert progress == list(range(8))
    said = [r.getMessage() for r in caplog.records if r.name == "comgra.sentinels"]
    # once per tensor, not per step: the input the NaN came in with (inputs are watched too), then the loss
    assert len(said) == 2 and [f"'{name}' holds a NaN at training step {NAN_STEP}" in message
                               for name, message in zip(("x", "loss"), said)] == [True, True]
    assert any(said[0] == note for note in GroupReader(tmp_path / "group").trial("trial").notes())
    rows = GroupReader(tmp_path / "group").trial("trial").evidence("sentinels").to_pylist()
    events = sorted({r["training_step"] for r in rows if r["event"] == "nan"})
    assert events[0] == NAN_STEP and control.run_state(tmp_path / "group" / "trials" / "trial")["state"] == "finished"
