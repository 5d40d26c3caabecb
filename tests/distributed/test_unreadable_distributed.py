"""comgra never stops a distributed run: real 2-rank torchrun runs (gloo, CPU) of unreadable_worker.py.

* DDP with find_unused_parameters=True and a registered output the loss does not use: comgra's gradient hook
  got None and raised in ``loss.backward()``.
* FSDP2 (fully_shard, default settings): a DTensor parameter reached the C kernel (SIGSEGV); without the
  kernel, recording stopped at the first recorded step. The parameters and their gradients are now recorded
  as whole tensors from their shards (their values are checked in test_sharded_statistics.py).

Each rank trains the same model with comgra and without it: the losses and final parameters must agree.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from comgra.store import GroupReader

pytest.importorskip("torch.distributed")
WORKER = Path(__file__).resolve().parent / "unreadable_worker.py"
SOURCE = Path(__file__).resolve().parents[2] / "src"


def run_torchrun(tmp_path: Path, mode: str) -> tuple[Path, dict[int, dict[str, Any]], str]:
    root, out = tmp_path / "root", tmp_path / "out"
    out.mkdir()
    environment = {**os.environ, "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": os.pathsep.join([str(SOURCE), os.environ.get("PYTHONPATH", "")])}
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(variable, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(WORKER), mode, str(root), str(out)]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = {rank: json.loads(path.read_text()) for rank, path in enumerate(sorted(out.glob("result-r*.json")))}
    assert sorted(results) == [0, 1]
    return root / "group", results, result.stderr


def _assert_training_unchanged(results: dict[int, dict[str, Any]]) -> None:
    for rank, result in results.items():
        assert result["with_comgra"] == result["without"], f"rank {rank}: comgra changed the losses"
        assert result["same_parameters"], f"rank {rank}: comgra changed the final parameters"


def _kinds(group_dir: Path, step: int, rank: int) -> set[tuple[str, str]]:
    trial = GroupReader(group_dir).trial("trial")
    return {(r["tensor_name"], r["kind"]) for r in trial.selection(training_step=step, rank=rank).to_pylist()}


@pytest.mark.slow
def test_ddp_with_an_output_the_loss_does_not_use(tmp_path: Path) -> None:
    group_dir, results, stderr = run_torchrun(tmp_path, "ddp-unused")
    _assert_training_unchanged(results)
    assert "stopped recording" not in stderr
    for rank in (0, 1):
        assert GroupReader(group_dir).trial("trial").steps(rank=rank)["training_step"].to_pylist() == [0, 2]
        for step in (0, 2):
            kinds = _kinds(group_dir, step, rank)
            assert {("used", "forward"), ("used", "gradients"), ("unused", "forward"), ("loss", "forward"),
                    ("model.body.weight", "forward"), ("model.body.weight", "gradients")} <= kinds
            assert ("unused", "gradients") not in kinds


@pytest.mark.slow
def test_fsdp2_with_default_settings_records_parameters_and_everything_else(tmp_path: Path) -> None:
    group_dir, results, stderr = run_torchrun(tmp_path, "fsdp2")
    _assert_training_unchanged(results)
    assert "stopped recording" not in stderr and "because it is a DTensor" not in stderr
    for rank in (0, 1):
        assert GroupReader(group_dir).trial("trial").steps(rank=rank)["training_step"].to_pylist() == [0, 2]
        for step in (0, 2):
            kinds = _kinds(group_dir, step, rank)
            assert {("x", "forward"), ("used", "forward"), ("used", "gradients"), ("unused", "forward"),
                    ("loss", "forward")} <= kinds
            for name in ("model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"):
                assert {(name, "forward"), (name, "gradients")} <= kinds
