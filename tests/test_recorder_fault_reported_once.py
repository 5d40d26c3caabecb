"""One fault of the trial folder (a full disk) is reported once, whoever meets it first (issue 21, item 14).

The writer (chunks) and the breakpoints' run-state publisher (live/run.json) both write into the trial
folder; before, a full disk gave one warning from each.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from comgra.capture.session import ComgraWarning  # noqa: E402
from comgra.objects import DecisionMakerForRecordingsHardcoded  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402


@pytest.mark.parametrize("full", ["every file", "run.json only", "chunks only"])
def test_a_full_disk_is_reported_once_and_training_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           full: str) -> None:
    real_replace = os.replace

    def replace(source: object, target: object, *args: object, **kwargs: object) -> None:
        name = Path(str(target)).name
        inside = str(target).startswith(str(tmp_path)) and name != "trial.json"
        hit = {"every file": inside, "run.json only": inside and name == "run.json",
               "chunks only": inside and name.endswith(".parquet")}[full]
        if hit:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(source, target, *args, **kwargs)

    recorder = ComgraRecorder(tmp_path, "group", "trial", DecisionMakerForRecordingsHardcoded({0, 1, 2, 3}),
                              flush_seconds=0.01)
    monkeypatch.setattr(os, "replace", replace)
    model = torch.nn.Linear(3, 2)
    generator = torch.Generator().manual_seed(0)
    losses = []
    with pytest.warns(ComgraWarning) as caught:
        for step in range(5):
            recorder.start_batch(step, 2)
            recorder.start_iteration()
            x = torch.randn(2, 3, generator=generator)
            recorder.register_tensor("x", x, is_input=True)
            y = model(x)
            recorder.register_tensor("y", y)
            loss = y.pow(2).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            loss.backward()
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            recorder.finish_batch()
            losses.append(loss.item())
            time.sleep(0.03)  # the writer meets the full disk between two steps
        recorder.finalize()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "No space left on device" in messages[0] and "Training goes on" in messages[0]
    assert len(losses) == 5
