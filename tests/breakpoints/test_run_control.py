"""Real processes: a training script pauses at a breakpoint, the test reads the paused step, then
continues, steps or aborts it, through comgra.breakpoints.control (what the app and the REST API call)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from comgra.errors import NotPaused
from comgra.breakpoints import control
from comgra.store import GroupReader
from live_processes import finish as _finish
from live_processes import losses as _losses
from live_processes import paused as _paused
from live_processes import start_training as _start
from live_processes import stop_all
from live_processes import wait_until as _wait


@pytest.fixture(autouse=True)
def _no_process_left_waiting() -> Any:
    """A failed test must not leave a training process paused forever."""
    yield
    stop_all()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The losses of the same run without breakpoints."""
    process, _, out = _start(tmp_path_factory.mktemp("baseline"))
    (out / "go").touch()
    _finish(process)
    return _losses(out)


def _loss_threshold(losses: list[float]) -> tuple[float, int]:
    """A threshold that the loss first crosses at a known step after the first few (from the baseline)."""
    threshold = min(losses[:4]) - 1e-9
    first = next(i for i, loss in enumerate(losses) if loss < threshold)
    return threshold, first


@pytest.mark.slow
def test_a_breakpoint_pauses_at_the_step_it_holds_and_training_continues_unchanged(
        tmp_path: Path, baseline: list[float]) -> None:
    threshold, expected_step = _loss_threshold(baseline)
    process, trial_dir, out = _start(tmp_path)
    _wait(lambda: control.run_state(trial_dir)["state"] == "running", process, "the run to start")
    added = control.add_breakpoint(trial_dir, "loss", f"mean < {threshold!r}")
    (out / "go").touch()
    state = _wait(lambda: _paused(trial_dir), process, "the breakpoint")
    assert state["training_step"] == expected_step and state["breakpoint"] == added["id"]
    assert control.list_breakpoints(trial_dir)[0]["hits"] == 1
    # Paused means paused: no step finishes while we look.
    time.sleep(0.5)
    assert (out / "progress-r000.txt").read_text() == str(expected_step - 1)
    # The paused step is in the store in full, though the policy records only step 0.
    trial = GroupReader(trial_dir.parent.parent).trial("trial")
    assert sorted(set(trial.steps()["training_step"].to_pylist())) == [0, expected_step]
    (loss_row,) = trial.selection(training_step=expected_step, node="loss", kind="forward").to_pylist()
    assert loss_row["mean"] == pytest.approx(baseline[expected_step], rel=1e-6)
    hidden = trial.selection(training_step=expected_step, node="hidden", kind="forward", aggregation="mean")
    assert hidden.num_rows == 1
    assert trial.selection(training_step=expected_step, node="hidden", kind="gradients").num_rows > 0
    # Disabled: it stops pausing; its hit count stays.
    control.update_breakpoint(trial_dir, added["id"], enabled=False)
    control.send_command(trial_dir, "continue")
    _finish(process)
    assert _losses(out) == baseline
    assert control.run_state(trial_dir)["state"] == "finished"
    assert control.list_breakpoints(trial_dir) == [{**added, "enabled": False, "hits": 1}]
    with pytest.raises(NotPaused):
        control.send_command(trial_dir, "continue")


@pytest.mark.slow
def test_step_pauses_at_the_next_step_and_records_it(tmp_path: Path, baseline: list[float]) -> None:
    process, trial_dir, out = _start(tmp_path, "--breakpoint", "hidden", "step == 3")
    (out / "go").touch()
    assert _wait(lambda: _paused(trial_dir), process, "the breakpoint")["training_step"] == 3
    control.send_command(trial_dir, "step")
    state = _wait(lambda: (s := _paused(trial_dir)) and s["training_step"] == 4 and s, process, "step 4")
    assert state["reason"] == "step" and state["breakpoint"] is None
    trial = GroupReader(trial_dir.parent.parent).trial("trial")
    assert sorted(set(trial.steps()["training_step"].to_pylist())) == [0, 3, 4]
    (loss_row,) = trial.selection(training_step=4, node="loss", kind="forward").to_pylist()
    assert loss_row["mean"] == pytest.approx(baseline[4], rel=1e-6)
    control.remove_breakpoint(trial_dir, "bp1")
    control.send_command(trial_dir, "continue")
    _finish(process)
    assert _losses(out) == baseline


@pytest.mark.slow
def test_abort_raises_training_aborted_in_the_training_loop(tmp_path: Path) -> None:
    process, trial_dir, out = _start(tmp_path, "--breakpoint", "loss", "step >= 2 and not has_nan")
    (out / "go").touch()
    _wait(lambda: _paused(trial_dir), process, "the breakpoint")
    control.send_command(trial_dir, "abort")
    _, errors = process.communicate(timeout=60)
    assert process.returncode != 0
    assert "comgra.errors.TrainingAborted: Training was aborted from comgra at step 2" in errors
    assert control.run_state(trial_dir)["state"] == "finished"
    assert control.run_state(trial_dir)["reason"] == "aborted"
    assert not (out / "losses-r000.json").exists()


@pytest.mark.slow
def test_two_torchrun_ranks_pause_and_resume_together(tmp_path: Path) -> None:
    baseline_process, _, baseline_out = _start(tmp_path / "baseline", ranks=2)
    (baseline_out / "go").touch()
    _finish(baseline_process)
    # A condition that holds on one rank only (from the baseline's inputs): both ranks must stop.
    # Rank 0 waits for the command, the other in a broadcast: neither may finish step 5 before it comes.
    input_max = [json.loads((baseline_out / f"input-abs-max-r{r:03d}.json").read_text())[5] for r in (0, 1)]
    assert input_max[0] != input_max[1]
    condition = f"step == 5 and abs_max > {min(input_max)!r}"
    process, trial_dir, out = _start(tmp_path / "live", "--breakpoint", "x", condition, ranks=2)
    (out / "go").touch()
    state = _wait(lambda: _paused(trial_dir), process, "the breakpoint", timeout=120)
    assert state["training_step"] == 5 and state["ranks"] == 2
    time.sleep(0.5)
    for rank in (0, 1):
        assert (out / f"progress-r{rank:03d}.txt").read_text() == "4", f"rank {rank} did not stop"
    # Every rank recorded step 5 in full, also the one where the condition did not hold (it learnt of
    # the hit when the ranks agreed at finish_batch, and replayed the step from what it had kept):
    # the same graph as the policy's step 0, the loss it computed, and the gradients.
    baseline_losses = {rank: _losses(baseline_out, rank) for rank in (0, 1)}
    trial = GroupReader(trial_dir.parent.parent).trial("trial")
    for rank in (0, 1):
        steps = {row["training_step"]: row for row in trial.steps(rank=rank).to_pylist()}
        assert sorted(steps) == [0, 5], f"rank {rank}"
        assert steps[5]["graph"] == steps[0]["graph"], f"rank {rank}: the paused step's graph lacks edges"
        (loss_row,) = trial.selection(training_step=5, rank=rank, node="loss", kind="forward").to_pylist()
        assert loss_row["mean"] == pytest.approx(baseline_losses[rank][5], rel=1e-6)
        for node in ("x", "hidden", "loss"):
            assert trial.selection(training_step=5, rank=rank, node=node, kind="gradients").num_rows > 0, (rank, node)
        # loss = mean((hidden - 1)^2) over 4 values, so d loss / d hidden = (hidden - 1) / 2, value by value.
        (hidden,) = trial.selection(training_step=5, rank=rank, node="hidden", kind="forward",
                                    aggregation="mean").to_pylist()
        (gradient,) = trial.selection(training_step=5, rank=rank, node="hidden", kind="gradients",
                                      aggregation="mean").to_pylist()
        assert gradient["mean"] == pytest.approx((hidden["mean"] - 1) / 2, rel=1e-5), f"rank {rank}"
    control.send_command(trial_dir, "continue")
    _finish(process)
    for rank in (0, 1):
        assert _losses(out, rank) == _losses(baseline_out, rank)
    assert control.run_state(trial_dir)["state"] == "finished"
    assert control.list_breakpoints(trial_dir)[0]["hits"] == 1
