"""Optimizers found without ``track_optimizer``: torch's global step hook records each optimizer's groups and
learning rates on recorded steps, so a stage frozen with a learning rate of 0 that another optimizer trains is
found, its fix is silent, and the hook is gone once the recorder finalizes."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn
from torch.optim import optimizer as torch_optimizer

from comgra.analysis import Scanner
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder


def _record(root: Path, trial: str, bug: bool) -> None:
    torch.manual_seed(0)
    body, head, auxiliary = nn.Linear(8, 32), nn.Linear(32, 4), nn.Linear(32, 4)
    model = nn.Sequential(body, nn.ReLU(), head)
    hooks = len(torch_optimizer._global_optimizer_pre_hooks)
    recorder = ComgraRecorder(root, "group", trial, DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=2))
    assert len(torch_optimizer._global_optimizer_pre_hooks) == hooks  # put on by a recorded step, while it lasts
    recorder.track_module("model", model)
    main = torch.optim.AdamW([{"params": body.parameters(), "lr": 0.0}, {"params": head.parameters()}], lr=1e-2)
    # The bug: the auxiliary head's optimizer built with model.parameters() too.
    second = torch.optim.SGD(list(model.parameters() if bug else []) + list(auxiliary.parameters()), lr=1e-2)
    centres = torch.randn(4, 8) * 2
    for step in range(30):
        y = torch.randint(0, 4, (32,))
        x = centres[y] + 0.5 * torch.randn(32, 8)
        recorder.start_batch(step, 32)
        assert len(torch_optimizer._global_optimizer_pre_hooks) == hooks + (step % 2 == 0)  # 1 in 2 recorded
        recorder.start_iteration()
        recorder.register_tensor("input", x, is_input=True)
        features = model[1](body(x))
        out = head(features)
        recorder.register_tensor("output", out)
        loss = nn.functional.cross_entropy(out, y)
        recorder.register_tensor("loss", loss, is_loss=True)
        main.zero_grad()
        second.zero_grad()
        (loss + 0.3 * nn.functional.cross_entropy(auxiliary(features), y)).backward()
        recorder.record_current_gradients("gradients")
        main.step()
        second.step()
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    assert len(torch_optimizer._global_optimizer_pre_hooks) == hooks  # removed when the recorder finalizes


def test_a_frozen_stage_that_another_optimizer_trains_is_found(tmp_path: Path) -> None:
    _record(tmp_path, "bug", bug=True)
    _record(tmp_path, "fixed", bug=False)
    findings = Scanner().scan(tmp_path / "group").findings
    loud = [f for f in findings if f.severity in ("error", "warning")]
    bug = [f for f in loud if f.trial == "bug"]
    assert bug and bug[0].detector == "optimizer_groups" and bug[0].evidence["problem"] == "frozen_but_changes", bug
    assert {f.role for f in bug if f.detector == "optimizer_groups"} == {"model.0.weight", "model.0.bias"}
    assert not [f for f in loud if f.trial == "fixed"], loud  # the body frozen by a learning rate of 0: no warning
    frozen = [f for f in findings if f.trial == "fixed" and f.detector == "parameter_frozen"]
    assert frozen and all(f.evidence.get("cause") == "lr_0" for f in frozen if f.role.startswith("model.0")), frozen
