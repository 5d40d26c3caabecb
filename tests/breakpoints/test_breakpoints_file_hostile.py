"""A hand-edited breakpoints.json never kills training: a clear warning, and the last good set stays.

A real training process (train_script.py) starts with a breakpoint that holds at step 6; before its
first step the file is replaced by a damaged one. The process must warn that it keeps its breakpoints,
still pause at step 6 (the last good set), continue when told, and end with exit code 0.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
from comgra.breakpoints import control  # noqa: E402
from live_processes import paused, start_training, stop_all, wait_until  # noqa: E402

pytestmark = pytest.mark.slow

DAMAGED = {
    "entry_without_id": json.dumps({"next_id": 2, "breakpoints": [{"target": "loss", "condition": "has_nan"}]}),
    "entry_without_target": json.dumps({"next_id": 2, "breakpoints": [{"id": "bp1", "condition": "has_nan"}]}),
    "entries_not_objects": json.dumps({"next_id": 2, "breakpoints": ["bp1", 3, None, [1]]}),
    "nested_100000": '{"next_id": 2, "breakpoints": ' + "[" * 100_000,
}


@pytest.fixture(autouse=True)
def _no_process_left_waiting() -> Iterator[None]:
    yield
    stop_all()


@pytest.mark.parametrize("damaged", list(DAMAGED.values()), ids=list(DAMAGED))
def test_a_damaged_breakpoints_file_is_reported_and_the_last_good_set_is_kept(tmp_path: Path, damaged: str) -> None:
    process, trial_dir, out = start_training(tmp_path, "--breakpoint", "loss", "step == 6")
    wait_until(lambda: control.list_breakpoints(trial_dir), process, "the breakpoints of the run")
    (trial_dir / "live" / "breakpoints.json").write_text(damaged)
    (out / "go").touch()
    state = wait_until(lambda: paused(trial_dir), process, "the breakpoint of the last good set")
    assert state["training_step"] == 6 and state["breakpoint"] == "bp1"
    (trial_dir / "live" / "breakpoints.json").unlink()  # so that the run can be continued from here
    control.send_command(trial_dir, "continue")
    _, errors = process.communicate(timeout=120)
    assert process.returncode == 0, errors[-3000:]
    assert "breakpoints.json" in errors and "keeps its breakpoints" in errors, errors[-3000:]
    assert "Traceback" not in errors, errors[-3000:]
    assert json.loads((out / "losses-r000.json").read_text())


@pytest.mark.parametrize("damaged", list(DAMAGED.values()), ids=list(DAMAGED))
def test_a_monitor_that_starts_beside_a_damaged_file_warns_and_has_no_breakpoints(tmp_path: Path, damaged: str) -> None:
    """The monitor reads breakpoints.json when it starts without breakpoints of its own: a damaged one is reported."""
    from comgra.config import BreakpointSettings
    from comgra.breakpoints.monitor import BreakpointMonitor

    (tmp_path / "live").mkdir()
    (tmp_path / "live" / "breakpoints.json").write_text(damaged)
    warnings: list[tuple[str, str]] = []
    monitor = BreakpointMonitor(tmp_path, BreakpointSettings(poll_interval_s=0), rank=0, world_size=1, initial=None,
                                warn=lambda key, message: warnings.append((key, message)))
    assert monitor.breakpoints == [] and not monitor.active
    assert monitor.start_batch(0, None) is False
    monitor.close()
    assert len(warnings) == 1 and "breakpoints.json" in warnings[0][1], warnings
