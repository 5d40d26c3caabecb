"""Real training loops with one bug each, and their fixed twins: the bug's finding on the buggy run, no warning
of the evidence detectors on the fixed one (issue 24: modes, optimizer groups, frozen stages, NaNs born on
unrecorded steps, transient jumps)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from comgra.recorder import ComgraRecorder
from evidence_runs import EVIDENCE_DETECTORS, Bug, scan, serious, train



def _fixed_is_clean(tmp_path: Path, bug: Bug, **options: bool) -> None:
    findings = scan(train(tmp_path / "fixed", "fixed", bug, **options))
    assert serious(findings, EVIDENCE_DETECTORS) == [], [f.message for f in serious(findings, EVIDENCE_DETECTORS)]


# shared_numbers: each evaluation takes the number of the training step after it (the Trainer's global_step), so
# the phases of a step come from its number and its type.
@pytest.mark.parametrize("shared_numbers", [False, True])
def test_dropout_and_batchnorm_left_in_training_mode_during_evaluation(tmp_path: Path, shared_numbers: bool) -> None:
    findings = scan(train(tmp_path / "buggy", "buggy", Bug(evaluate_in_eval_mode=False), shared_numbers=shared_numbers))
    dropout = [f for f in serious(findings, ("run_modes",)) if f.evidence["problem"] == "dropout_train_in_evaluation"]
    assert len(dropout) == 1 and dropout[0].severity == "error" and dropout[0].node == "net.3"
    assert dropout[0].training_step == 3  # the first evaluation step, recorded
    batchnorm = [f for f in findings if f.evidence.get("problem") == "batchnorm_train_in_evaluation"]
    assert [f.node for f in batchnorm] == ["net.1"]
    _fixed_is_clean(tmp_path, Bug(), shared_numbers=shared_numbers)


@pytest.mark.parametrize("shared_numbers", [False, True])
def test_model_left_in_evaluation_mode_after_evaluating(tmp_path: Path, shared_numbers: bool) -> None:
    findings = scan(train(tmp_path / "buggy", "buggy", Bug(back_to_train_mode=False), shared_numbers=shared_numbers))
    changed = [f for f in serious(findings, ("run_modes",)) if f.evidence["problem"] == "mode_changes_in_training"]
    assert sorted(f.node for f in changed) == ["net.1", "net.3"]
    # Recorded training steps: 0, 4 (after the first evaluation at step 3), 8, 12; eval mode from 4 on. Shared
    # numbers: 0, 3 (beside the evaluation 3), 6, 9; eval mode from 3 on.
    assert {f.training_step for f in changed} == ({3} if shared_numbers else {4})


def test_batchnorm_left_out_of_the_optimizer(tmp_path: Path) -> None:
    def without_batchnorm(net: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for name, p in net.named_parameters() if not name.startswith("1.")], lr=0.05)

    findings = scan(train(tmp_path / "buggy", "buggy", Bug(optimizer=without_batchnorm)))
    left_out = [f for f in serious(findings, ("optimizer_groups",)) if f.evidence["problem"] == "not_in_optimizer"]
    assert sorted(f.role for f in left_out) == ["net.1.bias", "net.1.weight"]
    assert all(f.evidence["gets_gradient"] and not f.evidence["changes"] for f in left_out)
    _fixed_is_clean(tmp_path, Bug(optimizer=lambda net: torch.optim.SGD(net.parameters(), lr=0.05)))


def _freeze_first_layer(clear_gradients: bool):
    def freeze(index: int, net: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if index == 2:  # fine-tuning: the first layer is frozen after two steps
            for parameter in net[0].parameters():
                parameter.requires_grad_(False)
                if clear_gradients:
                    parameter.grad = None
    return freeze


def test_a_frozen_stage_that_trains(tmp_path: Path) -> None:
    """Frozen with requires_grad=False, but its zeroed (not None) gradients stay, and SGD's momentum and weight decay
    keep changing it (the PyTorch forum's "frozen layers still update")."""
    def optimizer(net: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)

    findings = scan(train(tmp_path / "buggy", "buggy", Bug(optimizer=optimizer, before_step=_freeze_first_layer(False),
                                                          zero_grad_to_none=False)))
    frozen = [f for f in serious(findings, ("optimizer_groups",)) if f.evidence["problem"] == "frozen_but_changes"]
    assert sorted(f.role for f in frozen) == ["net.0.bias", "net.0.weight"]
    assert {f.training_step for f in frozen} == {8}  # frozen at the recorded steps 4 and 8: changed between them
    _fixed_is_clean(tmp_path, Bug(optimizer=optimizer, before_step=_freeze_first_layer(True), zero_grad_to_none=False))


def test_a_nan_born_on_an_unrecorded_step_is_not_blamed_on_a_parameter(tmp_path: Path) -> None:
    def nan_sample(index: int, x: torch.Tensor) -> torch.Tensor:
        if index == 5:  # training step 6 (after the evaluation at 3): not recorded (0, 4, 8, 12 are)
            x = x.clone()
            x[2, 1] = math.nan
        return x

    findings = scan(train(tmp_path / "buggy", "buggy", Bug(batch=nan_sample)))
    (born,) = [f for f in findings if f.detector == "sentinel_events"]
    # The NaN comes in with the input: the every-step sentinels watch inputs too, so it is born at x, then out and loss.
    assert born.severity == "error" and born.training_step == 6 and born.node == "x"
    assert born.evidence["tensors"] == ["x", "out", "loss"]
    assert findings[0] is born
    later = [f for f in findings if f.detector == "non_finite"]
    assert later and all(not f.origin and f.severity != "error" and f.evidence.get("born_on_unrecorded_step") == 6
                         for f in later)
    _fixed_is_clean(tmp_path, Bug())


def test_a_transient_jump_of_the_outputs_in_one_evaluation_pass(tmp_path: Path) -> None:
    def one_bad_batch(number: int, x: torch.Tensor) -> torch.Tensor:
        return x * 1e4 if number == 5 else x  # an unnormalised batch in the 6th evaluation (step 23: not recorded)

    group = train(tmp_path / "buggy", "buggy", Bug(evaluation_batch=one_bad_batch), steps=36)
    jumps = [f for f in serious(scan(group), ("sentinel_events",)) if f.node == "out"]
    assert [(f.training_step, f.severity) for f in jumps] == [(23, "warning")]
    assert jumps[0].evidence["abs_max"] > 1000 * jumps[0].evidence["running_median"]
    findings = scan(train(tmp_path / "fixed", "fixed", Bug(), steps=36))
    assert serious(findings, EVIDENCE_DETECTORS) == []


def test_the_sentinels_hold_every_step_as_computed(tmp_path: Path) -> None:
    """The sentinels' values are the tensors' as the test computes them, on recorded and unrecorded steps."""
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    recorder = ComgraRecorder(tmp_path, "group", "trial", _every(4))
    recorder.track_module("net", net)
    expected = {}
    for step in range(9):
        x = torch.randn(5, 3)
        recorder.start_batch(step, 5)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        out = net(x)
        recorder.register_tensor("out", out)
        loss = out.pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        expected[step] = (out.abs().max().item(), torch.linalg.norm(out).item(), loss.item())
    recorder.finalize()
    from comgra.store import GroupReader

    rows = GroupReader(tmp_path / "group").trial("trial").evidence("sentinels").to_pylist()
    by_key = {(r["training_step"], r["name"]): r for r in rows}
    # Step 0 knows no outputs yet (they are learned from the first recorded step's graph); the loss it knows.
    assert sorted(s for s, n in by_key if n == "out") == list(range(1, 9))
    for step, (abs_max, norm, loss) in expected.items():
        assert by_key[(step, "loss")]["abs_max"] == pytest.approx(loss, rel=1e-6)
        assert by_key[(step, "batch")]["numel"] == 5 and by_key[(step, "batch")]["event"] is None
        assert by_key[(step, "loss")]["recorded"] == (step % 4 == 0)
        if step:
            assert by_key[(step, "out")]["abs_max"] == pytest.approx(abs_max, rel=1e-6)
            assert by_key[(step, "out")]["norm"] == pytest.approx(norm, rel=1e-6)
            assert by_key[(step, "out")]["source"] == "output" and not by_key[(step, "out")]["has_nan"]


def _every(steps: int):
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType

    return DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=steps)


class _Sleeper(torch.nn.Module):
    """A layer that waits ``seconds(step)`` in its forward pass (a stand-in for a stall or a growing cost)."""

    def __init__(self, seconds) -> None:
        super().__init__()
        self.linear, self.seconds, self.step = torch.nn.Linear(4, 4), seconds, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(self.seconds(self.step))
        return self.linear(x)


def _profiled_run(directory: Path, seconds) -> list:
    torch.manual_seed(0)
    net = torch.nn.Sequential(_Sleeper(seconds), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    recorder = ComgraRecorder(directory, "group", "trial", _every(10))
    recorder.track_module("net", net, profile=True)
    for step in range(32):
        net[0].step = step
        x = torch.randn(8, 4)
        recorder.start_batch(step, 8)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        loss = net(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        optimizer.step()
    recorder.finalize()
    return [f for f in scan(directory / "group") if f.detector == "profile_spikes"]


@pytest.mark.slow
def test_a_layer_that_stalls_on_one_step_and_one_that_slows_down(tmp_path: Path) -> None:
    """Times on a shared machine are noisy: a stall of the OS's may add an info finding anywhere (on the small
    Linear layer a 5 ms stall is a larger ratio than the planted one, and ranks above it), so the test asks for
    the planted ones and for no slowdown where there is none."""
    spike = _profiled_run(tmp_path / "spike", lambda step: 0.3 if step == 20 else 0.002)
    planted = [(f.node, f.training_step, f.severity, f.evidence["problem"]) for f in spike
               if f.node == "net.0" and f.training_step == 20]
    assert planted == [("net.0", 20, "info", "time_spike")], [(f.node, f.training_step) for f in spike]
    assert not any(f.node == "net" and f.training_step == 20 for f in spike)  # its parent's time: the child's spike
    slower = _profiled_run(tmp_path / "slower", lambda step: 0.002 if step < 16 else 0.05)
    assert [(f.node, f.severity) for f in slower if f.evidence["problem"] == "slowdown"] == [("net.0", "warning")]
    steady = _profiled_run(tmp_path / "steady", lambda step: 0.002)
    assert [f for f in steady if f.severity != "info"] == []


def test_a_model_cast_to_another_dtype_partway(tmp_path: Path) -> None:
    def cast(index: int, net: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if index == 5:  # a cast meant for inference, left in the training loop
            net.double()

    bug = Bug(before_step=cast, batch=lambda index, x: x.double() if index >= 5 else x)
    findings = scan(train(tmp_path / "buggy", "buggy", bug, evaluate_every=100))
    changed = [f for f in serious(findings, ("run_modes",)) if f.evidence["problem"] == "dtype_changes"]
    # One finding per change: the registered tensors' (x, out, loss), the parameters' (the first layer's first).
    assert sorted((f.role, len(f.evidence["names"])) for f in changed) == [("net.0.bias", 6), ("x", 3)]
    assert {f.training_step for f in changed} == {6} and all(f.evidence["dtypes"] == ["float32", "float64"]
                                                            for f in changed)
    findings = scan(train(tmp_path / "fixed", "fixed", Bug(), evaluate_every=100))
    assert serious(findings, EVIDENCE_DETECTORS) == []


def test_a_streamed_scan_reads_the_evidence_as_a_scan_in_memory_does(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from comgra.analysis import loading, streaming

    def nan_sample(index: int, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, math.nan) if index == 5 else x

    def without_batchnorm(net: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for name, p in net.named_parameters() if not name.startswith("1.")], lr=0.05)

    group = train(tmp_path, "buggy", Bug(batch=nan_sample, optimizer=without_batchnorm, evaluate_in_eval_mode=False))
    in_memory = [(f.detector, f.node, f.training_step, f.severity, f.origin) for f in scan(group)
                 if f.detector in (*EVIDENCE_DETECTORS, "non_finite")]
    monkeypatch.setattr(loading, "IN_MEMORY_ROWS", 10)
    monkeypatch.setattr(streaming, "GROUP_ROWS", 200)
    streamed = [(f.detector, f.node, f.training_step, f.severity, f.origin) for f in scan(group)
                if f.detector in (*EVIDENCE_DETECTORS, "non_finite")]
    assert {d for d, *_ in in_memory} >= {"sentinel_events", "optimizer_groups", "run_modes", "non_finite"}
    evidence = [f for f in in_memory if f[0] != "non_finite"]
    assert [f for f in streamed if f[0] != "non_finite"] == evidence
    assert not any(f[0] == "non_finite" and f[4] for f in streamed)  # born on an unrecorded step: no origin
