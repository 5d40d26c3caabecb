"""comgra adds no collective to a torch.distributed run without breakpoints, and a failing collective of
its breakpoints switches them off, never the run (issue 21, item 16). Real 2-rank torchrun runs (gloo).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed")
WORKER = Path(__file__).resolve().parent / "breakpoint_collectives_worker.py"
STEPS = 25  # the breakpoints are shared every 10 steps by default: steps 0, 10 and 20
pytestmark = pytest.mark.slow


def run(tmp_path: Path, *extra: str, config: str | None = None) -> tuple[dict[int, Any], dict[int, list[float]], str]:
    root, out = tmp_path / "root", tmp_path / "out"
    out.mkdir(parents=True)
    if config is not None:
        (tmp_path / "comgra.toml").write_text(config)
        extra = (*extra, "--config", str(tmp_path / "comgra.toml"))
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(variable, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER),
               str(root), str(out), str(STEPS), *extra]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    collectives = {r: json.loads((out / f"collectives-r{r:03d}.json").read_text()) for r in (0, 1)}
    losses = {r: json.loads((out / f"losses-r{r:03d}.json").read_text()) for r in (0, 1)}
    return collectives, losses, result.stderr


def test_no_collective_of_comgra_without_breakpoints(tmp_path: Path) -> None:
    collectives, _, _ = run(tmp_path / "none")
    assert collectives[0]["comgra"] == 0 and collectives[1]["comgra"] == 0, collectives
    # The counter sees comgra's collectives where there are some: a run with a breakpoint has them.
    collectives, _, _ = run(tmp_path / "one", "--breakpoint", "loss", "has_nan")
    assert collectives[0]["comgra"] > STEPS and collectives[1]["comgra"] > STEPS, collectives


def test_a_breakpoint_set_while_a_run_without_breakpoints_trains_is_reported_not_checked(tmp_path: Path) -> None:
    """Checking it would take a collective that the run did not have: rank 0 says so (a warning, and a
    notice in run.json that the app and the REST API show), and the run goes on as it was."""
    _, baseline, _ = run(tmp_path / "baseline")
    collectives, losses, errors = run(tmp_path / "late", "--add-breakpoint-at", "5",
                                      config="[breakpoints]\npoll_interval_s = 0\n")
    assert collectives[0]["comgra"] == 0 and collectives[1]["comgra"] == 0, collectives
    assert losses == baseline
    assert errors.count("comgra does not check breakpoints in this torch.distributed run") == 1, errors[-3000:]
    from comgra.breakpoints import control

    state = control.run_state(tmp_path / "late" / "root" / "group" / "trials" / "trial")
    assert state["state"] == "finished" and "sync_without_breakpoints" in state["notice"]
    assert control.list_breakpoints(tmp_path / "late" / "root" / "group" / "trials" / "trial")[0]["hits"] == 0


@pytest.mark.parametrize("fault_rank", [0, 1])
def test_a_failing_collective_switches_breakpoints_off_never_the_run(tmp_path: Path, fault_rank: int) -> None:
    """comgra's 4th collective call on one rank raises (as a transfer fault would, on the receiving rank
    only); the other rank's next one times out. Both carry on training, with the losses of a run without
    comgra's breakpoints, and say that breakpoints are off."""
    _, baseline, _ = run(tmp_path / "baseline")
    config = "[breakpoints]\ncollective_timeout_s = 3\n"
    collectives, losses, errors = run(tmp_path / "fault", "--breakpoint", "loss", "max > 1e9", "--fault-rank",
                                      str(fault_rank), "--fault-call", "4", config=config)
    assert losses == baseline
    assert errors.count("comgra breakpoints are off") == 2, errors[-3000:]
    assert "injected transfer fault" in errors
    assert collectives[fault_rank]["comgra"] == 4, collectives  # nothing more after the fault
