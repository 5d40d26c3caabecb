"""Breakpoints in one process: hits against an independent computation, forced recording, modules.

A short pause_timeout_s lets each hit pause and continue on its own, so no second process is needed;
the real pause/continue protocol is tested with subprocesses in test_run_control.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from comgra.capture.session import ComgraWarning
from comgra.breakpoints import control
from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader
from comgra.store import format as fmt
from live_training import train_step

STEPS = 12


def _train(tmp_path: Path, breakpoints: list[dict[str, Any]]) -> tuple[ComgraRecorder, list[dict[str, float]]]:
    """Train STEPS steps; return the recorder and, per step, what the test computes itself."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "c.toml").write_text("[breakpoints]\npause_timeout_s = 0.01\npoll_interval_s = 0\n")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    recorder = ComgraRecorder(tmp_path / "root", "g", "t", DecisionMakerForRecordingsHardcoded({0}),
                              breakpoints=breakpoints, config=tmp_path / "c.toml", flush_seconds=60.0)
    recorder.track_module("model", model)
    data = torch.Generator().manual_seed(1)
    truth = []
    for step in range(STEPS):
        x = torch.randn(5, 3, generator=data)
        _, outputs = train_step(recorder, [("out", model)], optimizer, x, step)
        # The gradients are still those of this step after the optimizer's update.
        gradients = torch.cat([p.grad.reshape(-1) for p in model[0].parameters()])
        truth.append({"out_mean": outputs["out"].mean().item(), "first_grad_norm": gradients.norm().item()})
    recorder.finalize()
    return recorder, truth


def _between(values: list[float]) -> float:
    """Midway between two middle values: far from both, whatever the precision each side computes in."""
    return (values[STEPS // 2 - 1] + values[STEPS // 2]) / 2


def _recorded_steps(tmp_path: Path) -> list[int]:
    return sorted(set(GroupReader(tmp_path / "root" / "g").trial("t").steps()["training_step"].to_pylist()))


def _hits(tmp_path: Path) -> dict[str, int]:
    return {b["id"]: b["hits"] for b in control.list_breakpoints(fmt.trial_dir(tmp_path / "root" / "g", "t"))}


def test_hits_count_the_steps_where_a_tensor_condition_held_and_those_steps_are_recorded(tmp_path: Path) -> None:
    # A threshold from a first run, so that the condition holds on some steps and not on others.
    _, reference = _train(tmp_path / "reference", [])
    threshold = _between(sorted(t["out_mean"] for t in reference))
    _, truth = _train(tmp_path, [{"target": "out", "condition": f"mean > {threshold!r}"}])
    held = [step for step, t in enumerate(truth) if t["out_mean"] > threshold]
    assert 0 < len(held) < STEPS
    assert _hits(tmp_path) == {"bp1": len(held)}
    assert _recorded_steps(tmp_path) == sorted({0, *held})
    trial = GroupReader(tmp_path / "root" / "g").trial("t")
    for step in held:
        (row,) = trial.selection(training_step=step, node="out", kind="forward", aggregation="mean").to_pylist()
        assert row["mean"] == pytest.approx(truth[step]["out_mean"], rel=1e-5)


def test_a_module_gradient_condition_uses_the_norm_of_its_parameter_gradients(tmp_path: Path) -> None:
    _, reference = _train(tmp_path / "reference", [])
    threshold = _between(sorted(t["first_grad_norm"] for t in reference))
    _, truth = _train(tmp_path, [{"target": "model.0", "condition": f"grad_norm > {threshold!r}"},
                                 {"target": "model.2", "condition": "execution_time >= 0 and step >= 10"}])
    held = [step for step, t in enumerate(truth) if t["first_grad_norm"] > threshold]
    assert 0 < len(held) < STEPS
    assert _hits(tmp_path) == {"bp1": len(held), "bp2": 2}
    assert _recorded_steps(tmp_path) == sorted({0, 10, 11, *held})


def test_disabled_breakpoints_are_not_checked_and_the_losses_do_not_change(tmp_path: Path) -> None:
    _, reference = _train(tmp_path / "reference", [])
    _, truth = _train(tmp_path, [{"target": "out", "condition": "mean > -1e9", "enabled": False},
                                 {"target": "loss", "condition": "step == 4"}])
    assert truth == reference
    assert _hits(tmp_path) == {"bp1": 0, "bp2": 1}
    assert _recorded_steps(tmp_path) == [0, 4]


def test_a_metric_the_target_lacks_and_an_unknown_target_are_reported_once(tmp_path: Path) -> None:
    with pytest.warns(ComgraWarning) as caught:
        _train(tmp_path, [{"target": "out", "condition": "execution_time > 1"},
                          {"target": "outt", "condition": "has_nan"}])
    messages = [str(w.message) for w in caught]
    assert sum("execution_time" in m for m in messages) == 1
    assert sum("'outt'" in m and "did you mean 'out'" in m for m in messages) == 1
    assert _hits(tmp_path) == {"bp1": 0, "bp2": 0}
