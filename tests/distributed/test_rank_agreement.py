"""Two real torchrun ranks (gloo, CPU) whose DDP replicas diverge when one rank edits a parameter, and their twin
that does not: the scan names the parameter and the first recorded step where the ranks disagree (issue 24)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from comgra.analysis.scan import Scanner
from comgra.store import GroupReader

pytest.importorskip("torch.distributed")
WORKER = Path(__file__).resolve().parent / "diverging_worker.py"


def _run(tmp_path: Path, trial: str, buggy: bool) -> Path:
    out = tmp_path / f"out-{trial}"
    out.mkdir()
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(variable, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER),
               str(tmp_path / "root"), trial, str(out), "1" if buggy else "0"]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.mark.slow
def test_ranks_that_diverge_are_found_and_agreeing_ranks_are_not(tmp_path: Path) -> None:
    buggy_out, fixed_out = _run(tmp_path, "buggy", True), _run(tmp_path, "fixed", False)
    # What the ranks really hold at the end: the buggy run's replicas differ in one parameter only.
    buggy = [torch.load(buggy_out / f"params-r{r:03d}.pt") for r in (0, 1)]
    differing = sorted(name for name in buggy[0] if not torch.equal(buggy[0][name], buggy[1][name]))
    assert differing == ["2.bias"]
    fixed = [torch.load(fixed_out / f"params-r{r:03d}.pt") for r in (0, 1)]
    assert all(torch.equal(fixed[0][name], fixed[1][name]) for name in fixed[0])

    group = tmp_path / "root" / "group"
    trial = GroupReader(group).trial("buggy")
    info = trial.evidence("runinfo").to_pandas()
    bias = info[(info["name"] == "model.2.bias") & (info["field"] == "value_sum")]
    by_rank = {(int(r), int(s)): v for r, s, v in zip(bias["rank"], bias["training_step"], bias["number"])}
    assert by_rank[(0, 2)] == by_rank[(1, 2)] and by_rank[(0, 4)] != by_rank[(1, 4)]
    assert by_rank[(0, 4)] == pytest.approx(by_rank[(1, 4)] - 0.25, abs=1e-6)  # the edit, carried by identical updates

    findings = Scanner().scan(group).findings
    diverged = [f for f in findings if f.detector == "rank_agreement"]
    assert [(f.trial, f.role, f.training_step, f.severity) for f in diverged] == [
        ("buggy", "model.2.bias", 4, "error")]
    assert diverged[0] is next(f for f in findings if f.trial == "buggy")  # the first thing the scan says of it
