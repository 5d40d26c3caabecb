"""A real 2-rank torchrun run (gloo, CPU): every rank records its own shard of one trial.

The recording is checked rank by rank against the statistics each rank computed itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from comgra.service import RecordingService
from comgra.store import GroupReader

pytest.importorskip("torch.distributed")
WORKER = Path(__file__).resolve().parent / "ddp_worker.py"


def run_torchrun(tmp_path: Path, record_ranks: str) -> tuple[Path, dict[int, dict[str, Any]]]:
    root, out = tmp_path / "root", tmp_path / "out"
    out.mkdir()
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(variable, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(WORKER), str(root), str(out), record_ranks]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    expected = {rank: {int(step): values for step, values in json.loads(path.read_text()).items()}
                for rank, path in enumerate(sorted(out.glob("expected-r*.json")))}
    assert sorted(expected) == [0, 1]
    return root / "group", expected


def _statistic_row(trial: Any, step: int, rank: int, **filters: Any) -> dict[str, Any]:
    (row,) = trial.selection(training_step=step, rank=rank, **filters).to_pylist()
    return row


@pytest.mark.slow
def test_every_rank_records_its_own_shard_of_one_trial(tmp_path: Path) -> None:
    group_dir, expected = run_torchrun(tmp_path, "all")
    group = GroupReader(group_dir)
    assert group.trials() == ["trial"]
    trial = group.trial("trial")
    assert trial.ranks() == [0, 1]
    assert trial.metadata["world_size"] == 2
    # Different data per rank: reading one rank twice could not pass the checks below.
    assert expected[0][0]["hidden"] != pytest.approx(expected[1][0]["hidden"])
    for rank in (0, 1):
        steps = trial.steps(rank=rank)
        assert steps["training_step"].to_pylist() == [0, 2, 4] and set(steps["rank"].to_pylist()) == {rank}
        for step, values in expected[rank].items():
            hidden = _statistic_row(trial, step, rank, node="hidden", kind="forward")
            assert {k: hidden[k] for k in ("mean", "min", "max")} == pytest.approx(values["hidden"], rel=1e-5)
            loss = _statistic_row(trial, step, rank, node="loss", kind="forward")
            assert loss["mean"] == pytest.approx(values["loss"]["mean"], rel=1e-5)
            rows = trial.selection(training_step=step, rank=rank, kind="gradients").to_pylist()
            (gradient,) = [r for r in rows if r["tensor_name"] == "model.0.weight"]
            assert {k: gradient[k] for k in ("mean", "min", "max")} == pytest.approx(
                values["weight_gradient"], rel=1e-5, abs=1e-7)
    # All ranks side by side: one line per rank.
    series = trial.series(node="hidden", role="hidden", iteration=0, aggregation="none", statistic="max")
    assert series["rank"].to_pylist() == [0, 0, 0, 1, 1, 1]
    assert series["value"].to_pylist() == pytest.approx(
        [expected[r][s]["hidden"]["max"] for r in (0, 1) for s in (0, 2, 4)], rel=1e-5)

    service = RecordingService(group_dir)
    try:
        view = service.resolve({"node_id": "hidden", "rank": 1})
        assert view.choices.ranks == [0, 1]
        assert view.selection is not None and view.selection.rank == 1
        assert view.row is not None and view.row["max"] == pytest.approx(expected[1][0]["hidden"]["max"], rel=1e-5)
        assert service.resolve({"node_id": "hidden"}).selection.rank == 0  # type: ignore[union-attr]
    finally:
        service.close()
        group.close()


@pytest.mark.slow
def test_record_ranks_zero_records_rank_0_only(tmp_path: Path) -> None:
    group_dir, expected = run_torchrun(tmp_path, "zero")
    group = GroupReader(group_dir)
    trial = group.trial("trial")
    assert trial.ranks() == [0]
    files = [p.name for p in (group_dir / "trials" / "trial").rglob("*") if p.is_file()]
    assert not [name for name in files if "-r001-" in name or name.startswith("rank-001")]
    hidden = _statistic_row(trial, 2, 0, node="hidden", kind="forward")
    assert hidden["mean"] == pytest.approx(expected[0][2]["hidden"]["mean"], rel=1e-5)
    group.close()
