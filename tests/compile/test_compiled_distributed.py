"""torch.compile under torch.distributed: DDP and FSDP2 on 2 ranks (real torchrun, gloo, CPU).

distributed_compiled_worker.py runs, on each rank, the same GPT without comgra (compiled), with comgra eagerly
(the reference) and with comgra compiled, under ``DistributedDataParallel`` and under FSDP2's ``fully_shard``.
Both wrappers break the graph in torch's own code (DDP's logger and ``_inside_ddp_forward``; FSDP2 before each
sharded block); comgra adds none: the compiled run with comgra has the graph breaks of the run without it, all
in torch's files, compiles as many graphs, and nothing after warm-up. The recorded values, gradients (DDP:
the averaged ones) and graphs of each rank equal those of its eager run.
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

from comgra.store import GroupReader  # noqa: E402

from compiled_training import assert_rows_match, graph_shape, rows_by_key  # noqa: E402

WORKER = Path(__file__).resolve().parent / "distributed_compiled_worker.py"
RECORDED = (0, 2, 4)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("distributed")
    root, out = folder / "root", folder / "out"
    out.mkdir()
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCH_LOGS"):
        environment.pop(variable, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER),
               str(root), str(out)]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = {rank: json.loads((out / f"result-r{rank:03d}.json").read_text()) for rank in (0, 1)}
    return root / "group", results


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_comgra_adds_no_graph_break_and_no_compile_under_a_distributed_wrapper(
        wrapper: str, runs: tuple[Path, dict[int, dict[str, Any]]]) -> None:
    _, results = runs
    for rank in (0, 1):
        plain, compiled = results[rank][f"{wrapper}_plain"], results[rank][f"{wrapper}_compiled"]
        before, counts = compiled["before"], compiled["counts"]
        assert counts[0] == before, "the recorded step 0 ran eagerly: nothing traced"
        assert all(c == counts[1] for c in counts[2:]), f"compiled after warm-up: {counts}"
        assert all(c == plain["counts"][1] for c in plain["counts"][2:])

        def delta(run: dict[str, Any], name: str) -> int:
            return int(run["counts"][-1][name] - run["before"][name])

        assert delta(compiled, "graphs") == delta(plain, "graphs") >= 1
        assert delta(compiled, "graph_breaks") == delta(plain, "graph_breaks")
        assert len(compiled["graph_break_log"]) == len(plain["graph_break_log"])
        for message in compiled["graph_break_log"]:  # where each break is: in torch's files, never comgra's
            where = message.splitlines()[0]
            assert "/torch/" in where or "contextlib" in where, message
            assert "comgra" not in where and "nano_gpt" not in where and "register_tensor" not in message, message
        assert compiled["recompile_log"] == [] == plain["recompile_log"]


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_each_rank_records_what_its_eager_run_records(
        wrapper: str, runs: tuple[Path, dict[int, dict[str, Any]]]) -> None:
    group, results = runs
    reader = GroupReader(group)
    eager, compiled = reader.trial(f"{wrapper}_eager"), reader.trial(f"{wrapper}_compiled")
    assert compiled.ranks() == [0, 1]
    for rank in (0, 1):
        assert compiled.steps(rank=rank)["training_step"].to_pylist() == list(RECORDED)
        for step in RECORDED:
            rows = rows_by_key(compiled, step, rank)
            assert_rows_match(rows, rows_by_key(eager, step, rank))
            assert graph_shape(compiled, step, rank) == graph_shape(eager, step, rank)
            (loss,) = [r for key, r in rows.items() if key[0] == "forward" and key[2] == "loss"]
            assert loss["mean"] == pytest.approx(results[rank][f"{wrapper}_compiled"]["losses"][step], rel=1e-6)
            if wrapper == "ddp":  # parameters tracked: their gradients are DDP's averages, the same on both ranks
                assert any(key[0] == "gradients" and key[2] == "gpt.blocks.0.fc.weight" for key in rows)
    losses = [results[rank][f"{wrapper}_compiled"]["losses"] for rank in (0, 1)]
    assert losses[0] != pytest.approx(losses[1])  # each rank had its own data: reading one rank twice would fail
