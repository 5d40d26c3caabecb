"""DTensors recorded as whole tensors: real 2-rank torchrun runs (gloo, CPU) of sharded_worker.py.

The statistics of FSDP2's parameters and gradients and of tensor-parallel activations must equal those of the
same model unsharded in this process (within 1e-5), from the shards, with three all-reduces of comgra's per
recorded step and no all-gather; a fault of comgra's on one rank must not stop or hang the other.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from comgra.store import GroupReader

pytest.importorskip("torch.distributed")
HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "src"
STATISTICS = ("mean", "abs_mean", "std", "min", "max", "abs_max", "nan_count", "inf_count")
_spec = importlib.util.spec_from_file_location("sharded_worker", HERE / "sharded_worker.py")
worker = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(worker)  # type: ignore[union-attr]


def run_torchrun(tmp_path: Path, mode: str) -> tuple[Any, dict[int, dict[str, Any]], str]:
    root, out = tmp_path / "root", tmp_path / "out"
    out.mkdir()
    environment = {**os.environ, "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": os.pathsep.join([str(SOURCE), os.environ.get("PYTHONPATH", "")])}
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(variable, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(HERE / "sharded_worker.py"), mode, str(root), str(out)]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = {rank: json.loads(path.read_text()) for rank, path in enumerate(sorted(out.glob("result-r*.json")))}
    assert sorted(results) == [0, 1]
    for rank, run in results.items():
        assert run["with_comgra"] == run["without"], f"rank {rank}: comgra changed the losses"
        assert run["same_parameters"], f"rank {rank}: comgra changed the final parameters"
    return GroupReader(root / "group").trial("trial"), results, result.stderr


def expected_statistics(values: torch.Tensor) -> dict[str, float]:
    """What comgra records for a plain tensor, from torch in float64: NaN makes every statistic but the counts NaN."""
    wide = values.double().reshape(-1)
    nan, inf = int(torch.isnan(wide).sum()), int(torch.isinf(wide).sum())
    if nan:
        return dict(zip(STATISTICS, [math.nan] * 6 + [nan, inf]))
    mean = float(wide.mean())
    std = math.nan if inf else float(((wide - wide.mean()) ** 2).mean().sqrt())
    return {"mean": mean, "abs_mean": float(wide.abs().mean()), "std": std, "min": float(wide.min()),
            "max": float(wide.max()), "abs_max": float(wide.abs().max()), "nan_count": nan, "inf_count": inf}


def assert_row(row: dict[str, Any], values: torch.Tensor, label: str) -> None:
    expected = expected_statistics(values)
    recorded = {name: row[name] for name in STATISTICS}
    assert recorded == pytest.approx(expected, rel=1e-5, abs=1e-6, nan_ok=True), label


def rows_of(trial: Any, step: int, rank: int, name: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in trial.selection(training_step=step, rank=rank, kind=kind).to_pylist() if r["tensor_name"] == name]


def assert_recorded(trial: Any, step: int, name: str, kind: str, values: torch.Tensor, batched: bool) -> None:
    """On both ranks: the whole tensor's statistics (per sample where batched) and its first values."""
    for rank in (0, 1):
        rows = rows_of(trial, step, rank, name, kind)
        label = f"{name} {kind} step {step} rank {rank}"
        if not batched:
            (row,) = rows
            assert_row(row, values, label)
            assert row["neurons"] == pytest.approx(values.reshape(-1)[:5].tolist(), rel=1e-5, abs=1e-7, nan_ok=True), label
            continue
        samples = {r["sample"]: r for r in rows if r["aggregation"] == "sample"}
        assert sorted(samples) == list(range(values.shape[0])), label
        for index, row in samples.items():
            assert_row(row, values[index], f"{label} sample {index}")
            first = values[index].reshape(-1)[:5].tolist()
            assert row["neurons"] == pytest.approx(first, rel=1e-5, abs=1e-7, nan_ok=True), f"{label} sample {index} neurons"
        (mean_row,) = [r for r in rows if r["aggregation"] == "mean"]
        per_sample = [expected_statistics(values[i])["max"] for i in range(values.shape[0])]
        assert mean_row["max"] == pytest.approx(sum(per_sample) / len(per_sample), rel=1e-5, nan_ok=True), label


def extra_collectives(results: dict[int, dict[str, Any]], rank: int, step: int) -> dict[str, int]:
    with_comgra, without = results[rank]["calls_with"][step], results[rank]["calls_without"][step]
    names = set(with_comgra) | set(without)
    return {name: with_comgra.get(name, 0) - without.get(name, 0) for name in names
            if with_comgra.get(name, 0) != without.get(name, 0)}


def fsdp2_reference() -> dict[int, dict[str, dict[str, torch.Tensor]]]:
    """The unsharded model trained in this process on both ranks' batches: per recorded step, each parameter's
    value before the update and its gradient (FSDP2 averages the ranks' gradients: the mean loss over both)."""
    model = worker.plain_model("fsdp2")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    for step in range(worker.STEPS):
        x = torch.cat([worker.batch("fsdp2", step, rank) for rank in (0, 1)])
        values = {f"model.{n}": p.detach().clone() for n, p in model.named_parameters()}
        optimizer.zero_grad()
        (model(x) ** 2).mean().backward()
        reference[step] = {"forward": values,
                           "gradients": {f"model.{n}": p.grad.clone() for n, p in model.named_parameters()}}
        optimizer.step()
    return reference


@pytest.mark.slow
def test_fsdp2_parameters_and_gradients_are_the_whole_tensors(tmp_path: Path) -> None:
    trial, results, stderr = run_torchrun(tmp_path, "fsdp2")
    reference = fsdp2_reference()
    for step in (0, 2):
        for kind in ("forward", "gradients"):
            for name, values in reference[step][kind].items():
                assert_recorded(trial, step, name, kind, values, batched=False)
    names = {r["tensor_name"] for r in trial.selection(training_step=0, rank=0).to_pylist()}
    assert {"model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"} <= names
    assert not [n for n in names if "_fsdp" in n or "_orig_mod" in n]
    for rank in (0, 1):
        for step in range(worker.STEPS):
            expected = {"allreduce_": 3} if step in (0, 2) else {}
            assert extra_collectives(results, rank, step) == expected, (rank, step)
        assert results[rank]["own"]["collectives"] == 6
    assert "DTensor" not in stderr


def tp_reference() -> dict[int, dict[str, dict[str, torch.Tensor]]]:
    """The unsharded MLP on the same input: the registered values, their gradients, the parameters'."""
    model = worker.plain_model("tp")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    for step in range(worker.STEPS):
        x = worker.batch("tp", step, 0)
        clean = torch.nan_to_num(x, nan=0.0, posinf=1.0)
        parameters = {f"model.{n}": p.detach().clone() for n, p in model.named_parameters()}
        hidden = model[1](model[0](clean))
        output = model[2](hidden)
        hidden.retain_grad()
        output.retain_grad()
        optimizer.zero_grad()
        (output ** 2).mean().backward()
        reference[step] = {
            "forward": {"x_rows": x, "x_columns": x, "addends": clean * 3, "hidden": hidden.detach(), "output": output.detach(),
                        **parameters},
            "gradients": {"hidden": hidden.grad, "output": output.grad,  # type: ignore[dict-item]
                          **{f"model.{n}": p.grad.clone() for n, p in model.named_parameters()}}}
        optimizer.step()
    return reference


@pytest.mark.slow
def test_tensor_parallel_activations_are_the_whole_tensors(tmp_path: Path) -> None:
    trial, results, stderr = run_torchrun(tmp_path, "tp")
    reference = tp_reference()
    for step in (0, 2):  # step 2's input has a NaN in a sample of rank 0's rows and an inf in one of rank 1's
        for kind in ("forward", "gradients"):
            for name, values in reference[step][kind].items():
                assert_recorded(trial, step, name, kind, values, batched=not name.startswith("model."))
    for rank in (0, 1):
        for step in range(worker.STEPS):
            # comgra's three, and the one that reduces the Partial tensor ('addends') before its shards are read
            expected = {"allreduce_": 3, "all_reduce": 1} if step in (0, 2) else {}
            assert extra_collectives(results, rank, step) == expected, (rank, step)
    sub_mesh = [line for line in stderr.splitlines() if "cannot summarise the values of tensor 'x_on_a_sub_mesh' "
                "because its device mesh holds 1 of the world's 2 ranks (a sub-mesh)" in line]
    assert len(sub_mesh) == 2, stderr[-3000:]  # once on each rank, not once per recorded step
    assert stderr.count("cannot summarise") == 2
    for rank in (0, 1):
        assert rows_of(trial, 0, rank, "x_on_a_sub_mesh", "forward") == []


@pytest.mark.slow
def test_a_fault_of_comgra_on_one_rank_neither_stops_nor_hangs_the_other(tmp_path: Path) -> None:
    trial, results, stderr = run_torchrun(tmp_path, "fault")
    reference = fsdp2_reference()
    weight = reference[0]["forward"]["model.0.weight"]
    assert_recorded(trial, 0, "model.0.weight", "forward", weight, batched=False)
    for rank in (0, 1):  # step 2: rank 1 could not read a shard; both ranks leave the step's DTensors out
        assert rows_of(trial, 2, rank, "model.0.weight", "forward") == []
        assert rows_of(trial, 2, rank, "x", "forward")  # the rest of the step is recorded
    assert "the ranks did not agree on them (a rank's comgra met a fault)" in stderr
    # step 4: rank 1's recording stopped; rank 0 waited for it at most the timeout, then went on without
    assert rows_of(trial, 4, 0, "model.0.weight", "forward") == []
    assert rows_of(trial, 4, 0, "x", "forward")
    assert "comgra stops combining DTensor shards across ranks since a collective of comgra's failed" in stderr
    assert "comgra stopped recording trial 'trial'" in stderr
