"""A small sweep recorded by the real recorder: trials with hyperparameters and KPIs, finished, crashed, running."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

GROUP = "sweep"
# trial -> (hyperparameters, losses per step); lr 0.1 has two seeds, so grouping by lr averages them.
TRIALS: dict[str, tuple[dict[str, Any], list[float]]] = {
    "lr0.1_seed0": ({"lr": 0.1, "model": {"width": 8}, "seed": 0, "optimizer": "adam"}, [1.0, 0.5, 0.25, 0.3]),
    "lr0.1_seed1": ({"lr": 0.1, "model": {"width": 8}, "seed": 1, "optimizer": "adam"}, [1.2, 0.7, 0.45, 0.5]),
    "lr0.01_seed0": ({"lr": 0.01, "model": {"width": 16}, "seed": 0, "optimizer": "sgd"}, [1.0, 0.9, 0.8, 0.7]),
}
CRASHED = "lr1.0_seed0"  # its process dies after 2 steps, without finalize
CRASHED_HYPERPARAMETERS = {"lr": 1.0, "model": {"width": 8}, "seed": 0, "optimizer": "adam"}


def record_trial(root: Path, trial_id: str, hyperparameters: dict[str, Any], losses: list[float], *,
                 finalize: bool = True) -> Any:
    """Record one trial in this process; returns the recorder (finalized unless ``finalize=False``)."""
    import torch

    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    recorder = ComgraRecorder(root, GROUP, trial_id, DecisionMakerForRecordingsHardcoded({0}), flush_seconds=0.05,
                              resource_seconds=None)
    model = torch.nn.Linear(2, 1)
    recorder.track_module("net", model)
    recorder.record_hyperparameters(hyperparameters)
    for step, loss in enumerate(losses):
        recorder.start_batch(step, 2)
        recorder.start_iteration()
        x = torch.ones(2, 2)
        recorder.register_tensor("input", x, is_input=True)
        out = model(x).sum()
        recorder.register_tensor("loss", out, is_loss=True)
        recorder.record_kpi_in_graph("loss", "train", loss, record_even_if_recording_is_inactive=True)
        recorder.record_kpi_in_graph("accuracy", "val", 1 - loss, record_even_if_recording_is_inactive=True)
        recorder.finish_iteration()
        recorder.finish_batch()
    if finalize:
        recorder.finalize()
    else:
        recorder.flush()
    return recorder


def record_crashed(root: Path) -> None:
    """A trial whose process flushes two steps, then dies (os._exit: no finalize, no atexit)."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from pathlib import Path
        from tests.runs.sweep_recording import record_trial, CRASHED, CRASHED_HYPERPARAMETERS
        record_trial(Path({str(root)!r}), CRASHED, CRASHED_HYPERPARAMETERS, [2.0, 3.0], finalize=False)
        os._exit(1)
    """)
    subprocess.run([sys.executable, "-c", script], check=False, timeout=300)


def record_sweep(root: Path) -> Path:
    """The finished trials and the crashed one; returns the group folder."""
    for trial_id, (values, losses) in TRIALS.items():
        record_trial(root, trial_id, values, losses)
    record_crashed(root)
    return root / GROUP
