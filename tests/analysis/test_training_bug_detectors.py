"""The detectors of training bugs (loss curve, updates, shapes, units, growth within a step, detach, user detectors),
each on a small recording with one planted bug and on the same program without it."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

from comgra.analysis import Finding, Scanner, register_detector, unregister_detector
from comgra.analysis.findings import rank_findings

GROUP = "g"
# Integer class labels and targets that feed only the loss, as users register them: comgra says once that it
# cannot draw their edges; that is not what these tests are about.
pytestmark = pytest.mark.filterwarnings("ignore::comgra.capture.session.ComgraWarning")


@dataclass
class Program:
    """A three-layer MLP trained on a learnable task; each field plants one bug."""

    steps: int = 40
    batch: int = 32
    lr: float = 0.05
    classes: int = 0  # 0: regression
    zero_grad: bool = True
    activation: Callable[[], nn.Module] = nn.ReLU
    last: nn.Module | None = None
    init: Callable[[nn.Sequential], None] | None = None
    inputs: Callable[[int, torch.Tensor], torch.Tensor] | None = None
    targets: Callable[[torch.Tensor], torch.Tensor] | None = None
    lr_at: Callable[[int], float] | None = None
    weight_decay: float = 0.0
    detach_hidden: bool = False
    sign: float = 1.0
    adam: bool = False  # Adam instead of SGD
    extra: dict[str, Any] = field(default_factory=dict)


def record(root: Path, trial: str, program: Program) -> Path:
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    width = program.classes or 1
    layers = [nn.Linear(8, 32), program.activation(), nn.Linear(32, 32), program.activation(), nn.Linear(32, width)]
    model = nn.Sequential(*layers, *([program.last] if program.last is not None else []))
    if program.init is not None:
        with torch.no_grad():
            program.init(model)
    centres = torch.randn(max(program.classes, 1), 8, generator=generator) * 2
    mixing = torch.randn(8, 1, generator=generator) / 8 ** 0.5
    recorder = ComgraRecorder(root, GROUP, trial, DecisionMakerForRecordingsHardcoded(set(range(program.steps))),
                              max_num_batch_size_to_record=8, resource_seconds=None)
    recorder.track_module("model", model)
    optimizer = (torch.optim.Adam if program.adam else torch.optim.SGD)(model.parameters(), lr=program.lr,
                                                                        weight_decay=program.weight_decay)
    for step in range(program.steps):
        if program.lr_at is not None:
            for group in optimizer.param_groups:
                group["lr"] = program.lr_at(step)
        if program.classes:
            y = torch.randint(0, program.classes, (program.batch,), generator=generator)
            x = centres[y] + 0.5 * torch.randn(program.batch, 8, generator=generator)
        else:
            x = torch.randn(program.batch, 8, generator=generator)
            y = torch.tanh(x @ mixing) + 0.3 * x @ mixing
        x = program.inputs(step, x) if program.inputs else x
        y = program.targets(y) if program.targets else y
        recorder.start_batch(step, x.shape[0])
        recorder.start_iteration()
        recorder.register_tensor("input", x, is_input=True)
        hidden = model[1](model[0](x))
        recorder.register_tensor("hidden", hidden)
        if program.detach_hidden:
            hidden = hidden.detach()
        output = model[2:](hidden)
        recorder.register_tensor("output", output)
        recorder.register_tensor("target", y, is_target=True)
        if program.classes:
            loss = program.sign * nn.functional.cross_entropy(output, y)
        else:
            loss = program.sign * nn.functional.mse_loss(output, y)
        recorder.register_tensor("loss", loss, is_loss=True)
        if program.zero_grad:
            optimizer.zero_grad()
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        optimizer.step()
        recorder.finish_batch()
    recorder.finalize()
    return root / GROUP


def _scale_first(factor: float) -> Callable[[nn.Sequential], None]:
    return lambda model: model[2].weight.mul_(factor)


def _constant(model: nn.Sequential) -> None:
    for layer in (model[0], model[2], model[4]):
        layer.weight.fill_(0.1)
        layer.bias.zero_()


PLANTED = [
    # (name, the bugged program, detector, node)
    ("missing zero_grad", Program(zero_grad=False, classes=4, lr=0.01), "stale_gradient", "model."),
    # Long enough for the optimizer to move the parameters well past its step size (40 SGD steps on labels without
    # signal are a random walk of about 9 steps: too early to tell from a plateau, an info).
    ("labels unrelated to inputs", Program(classes=4, steps=80, adam=True, lr=0.003,
                                           targets=lambda y: y[torch.randperm(len(y))]), "loss_stuck", "loss"),
    ("learning rate set to 0 partway", Program(classes=4, lr_at=lambda step: 0.05 if step < 15 else 0.0),
     "parameter_stopped", "model."),
    ("constant initialisation", Program(classes=4, activation=nn.Tanh, init=_constant), "identical_units", "hidden"),
    pytest.param("target broadcast (B, 1) against (B,)", Program(targets=lambda y: y[:, 0]), "shape_mismatch", "output",
                 marks=pytest.mark.filterwarnings("ignore:Using a target size")),  # torch's own warning of the bug
    ("a batch of one row", Program(inputs=lambda step, x: x[:1], targets=lambda y: y[:1]), "batch_size", "input"),
    ("ReLU on a regression output", Program(last=nn.ReLU(), targets=lambda y: y * 3), "output_range", "output"),
    ("one corrupted batch", Program(classes=4, inputs=lambda step, x: x * 1e4 if step == 20 else x),
     "transient_jump", "input"),
    ("constant target", Program(targets=torch.zeros_like), "constant_target", "target"),
    ("a layer 300x too large", Program(classes=4, init=_scale_first(300.0), lr=1e-4), "growth_along_edge", "output"),
    ("accidental detach", Program(classes=4, detach_hidden=True), "accidental_detach", "hidden"),
    ("loss sign flipped", Program(classes=4, sign=-1.0), "loss_diverging", "loss"),
    ("weight decay far too strong", Program(classes=4, weight_decay=5.0), "parameter_shrinking", "model."),
    ("learning rate far too low", Program(classes=4, lr=1e-7), "update_ratio", "model."),
]


def _loud(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity in ("error", "warning")]


@pytest.mark.parametrize("name, program, detector, node", PLANTED,
                         ids=[p.values[0] if hasattr(p, "values") else p[0] for p in PLANTED])
def test_planted_bug_is_found_and_its_fix_is_not(tmp_path, name, program, detector, node):
    group = record(tmp_path, "bug", program)
    found = [f for f in _loud(Scanner().scan(group).findings) if f.detector == detector]
    assert found, f"{name}: no {detector} warning"
    assert found[0].node.startswith(node)
    fixed = record(tmp_path / "fixed", "fixed", Program(classes=program.classes))
    assert not [f for f in _loud(Scanner().scan(fixed).findings) if f.detector == detector]


def test_units_that_die_partway_are_dead(tmp_path):
    """A large update at step 15 (a bad schedule) pushes the first layer's biases far below zero: its ReLUs die."""
    layers: list[nn.Sequential] = []

    def learning_rate(step: int) -> float:
        if step == 15:
            with torch.no_grad():
                layers[0][0].bias.sub_(30.0)
        return 0.05

    group = record(tmp_path, "dies", Program(classes=4, init=layers.append, lr_at=learning_rate))
    dead = [f for f in _loud(Scanner().scan(group).findings) if f.detector == "dead_units" and f.node == "hidden"]
    assert dead and dead[0].evidence.get("partway") and 14 <= dead[0].evidence["died_at_median"] <= 17


def test_healthy_training_has_no_warning(tmp_path):
    group = record(tmp_path, "healthy", Program(classes=4))
    assert _loud(Scanner().scan(group).findings) == []


def test_a_bias_whose_gradient_is_zero_by_construction_is_info_only(tmp_path):
    """A Linear bias before BatchNorm: its gradient is zero up to rounding, its weight's is not."""
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    recorder = ComgraRecorder(tmp_path, GROUP, "bn", DecisionMakerForRecordingsHardcoded(set(range(30))),
                              max_num_batch_size_to_record=8, resource_seconds=None)
    recorder.track_module("model", model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    centres = torch.randn(4, 8) * 2
    for step in range(30):
        y = torch.randint(0, 4, (32,))
        x = centres[y] + 0.5 * torch.randn(32, 8)
        recorder.start_batch(step, 32)
        recorder.start_iteration()
        recorder.register_tensor("input", x, is_input=True)
        output = model(x)
        recorder.register_tensor("output", output)
        loss = nn.functional.cross_entropy(output, y)
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        optimizer.step()
        recorder.finish_batch()
    recorder.finalize()
    findings = Scanner().scan(tmp_path / GROUP).findings
    bias = [f for f in findings if f.node == "model.0.bias" and f.detector == "vanishing_gradient"]
    assert bias and all(f.severity == "info" for f in bias)
    assert _loud(findings) == []


def test_a_recurrence_that_grows_within_a_step(tmp_path):
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    torch.manual_seed(0)
    cell, readout = nn.Linear(16, 16, bias=False), nn.Linear(16, 1)
    with torch.no_grad():
        cell.weight.copy_(torch.eye(16) * 1.6)
    recorder = ComgraRecorder(tmp_path, GROUP, "rnn", DecisionMakerForRecordingsHardcoded(set(range(12))),
                              max_num_batch_size_to_record=4, resource_seconds=None)
    recorder.track_module("model", nn.ModuleList([cell, readout]))
    for step in range(12):
        recorder.start_batch(step, 8)
        h = torch.randn(8, 16)
        for t in range(12):
            recorder.start_iteration()
            h = cell(h) + 0.1
            recorder.register_tensor("state", h)
            if t < 11:
                recorder.finish_iteration()
        loss = readout(h).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    found = [f for f in Scanner().scan(tmp_path / GROUP).findings if f.detector == "growth_within_step"]
    assert found and found[0].node == "state" and found[0].severity == "warning"
    assert found[0].evidence["orders_of_magnitude"] == pytest.approx(11 * __import__("math").log10(1.6), abs=0.5)


def test_equal_scores_are_ordered_by_evidence_not_by_name():
    def finding(node: str, orders: float) -> Finding:
        return Finding(detector="d", severity="warning", score=1.0, trial="t", node=node, role=node, kind="forward",
                       training_step=0, message="", evidence={"orders_of_magnitude": orders})

    ranked = rank_findings([finding("a_weak", 4.5), finding("z_strong", 9.0)])
    assert [f.node for f in ranked] == ["z_strong", "a_weak"]


def _high_loss(data, facts, options):
    rows = data.stats[(data.stats["tensor_type"] == "loss") & (data.stats["kind"] == "forward")]
    return [Finding(detector="loss_recorded", severity="warning", score=0.5, trial=data.trial, node="loss",
                    role="loss", kind="forward", training_step=int(rows["training_step"].min()),
                    message=f"{len(rows)} loss rows")]


def test_a_registered_user_detector_runs_in_every_scan(tmp_path):
    group = record(tmp_path, "user", Program(classes=4, steps=8))
    register_detector("loss_recorded", _high_loss)
    try:
        found = [f for f in Scanner().scan(group).findings if f.detector == "loss_recorded"]
        assert len(found) == 1 and found[0].message == "8 loss rows"
    finally:
        unregister_detector("loss_recorded")
    assert not [f for f in Scanner().scan(group).findings if f.detector == "loss_recorded"]


def test_a_user_detector_that_raises_is_reported_and_the_others_run(tmp_path):
    group = record(tmp_path, "user", Program(classes=4, steps=8, targets=torch.zeros_like))

    def broken(data, facts, options):
        raise RuntimeError("my bug")

    register_detector("broken_check", broken)
    try:
        result = Scanner().scan(group)
    finally:
        unregister_detector("broken_check")
    assert any("broken_check" in p and "my bug" in p for p in result.problems)


def test_register_detector_rejects_a_built_in_name():
    from comgra.errors import ConfigError

    with pytest.raises(ConfigError, match="built-in"):
        register_detector("loss_curve", _high_loss)


def test_comgra_scan_runs_a_detector_named_in_comgra_toml(tmp_path):
    group = record(tmp_path, "user", Program(classes=4, steps=8))
    (tmp_path / "my_checks.py").write_text(textwrap.dedent('''
        from comgra.analysis import Finding

        def every_loss(data, facts, options):
            rows = data.stats[(data.stats["tensor_type"] == "loss") & (data.stats["kind"] == "forward")]
            return [Finding(detector="every_loss", severity="warning", score=0.5, trial=data.trial, node="loss",
                            role="loss", kind="forward", training_step=0, message=f"{len(rows)} rows")]
    '''))
    (tmp_path / "comgra.toml").write_text('[anomalies]\ndetectors = ["my_checks:every_loss"]\n')
    comgra = str(Path(sys.executable).parent / "comgra")
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{Path(__file__).parents[2] / 'src'}"}
    done = subprocess.run([comgra, "scan", "--path", str(group), "--json"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, check=True)
    found = [f for f in json.loads(done.stdout)["findings"] if f["detector"] == "every_loss"]
    assert len(found) == 1 and found[0]["message"] == "8 rows"


def test_the_service_behind_the_app_and_the_rest_api_runs_a_user_detector(tmp_path):
    from comgra.service import RecordingService

    group = record(tmp_path, "user", Program(classes=4, steps=8))
    register_detector("loss_recorded", _high_loss)
    service = RecordingService(group)
    try:
        found = [f for f in service.findings("user") if f.detector == "loss_recorded"]
        assert len(found) == 1 and found[0].message == "8 loss rows"
    finally:
        service.close()
        unregister_detector("loss_recorded")


@pytest.mark.parametrize("curve, expected", [
    (lambda step: 1.0 + 0.02 * ((step * 7) % 5), "loss_not_decreasing"),  # flat with noise
    (lambda step: 2.0 * 0.9 ** step, None),  # decreasing
    (lambda step: 0.5 * 1.15 ** step, "loss_diverging"),
    (lambda step: -1.0 - 0.5 * step ** 1.5, "loss_diverging"),  # a maximised loss, below zero without bound
])
def test_the_loss_curve_is_judged_against_itself(curve, expected):
    import pandas as pd

    from comgra.analysis import ScanOptions
    from comgra.analysis.curves import loss_curve
    from comgra.analysis.graphs import GraphFacts
    from comgra.analysis.loading import TrialData

    steps = list(range(40))
    rows = [dict(training_step=s, kind="forward", iteration=0, node="loss", role="loss", tensor_type="loss",
                 aggregation="none", sample=-1, mean=curve(s)) for s in steps]
    rows += [dict(training_step=s, kind="gradients", iteration=0, node="loss", role="loss", tensor_type="loss",
                  aggregation="none", sample=-1, mean=1.0) for s in steps]
    data = TrialData("t", pd.DataFrame(rows), {}, pd.DataFrame({"training_step": steps, "type_of_execution": "train",
                                                                 "iteration": 0, "graph": "g"}), {})
    found = loss_curve(data, GraphFacts(role={"loss": "loss"}), ScanOptions())
    assert [f.detector for f in found] == ([expected] if expected else [])
