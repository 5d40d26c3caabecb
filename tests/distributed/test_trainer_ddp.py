"""The Trainer callback under DDP records the gradients the optimizer applies: all-reduced over the ranks, summed
over the micro-batches of gradient accumulation, not yet clipped (a real 2-rank torchrun, gloo, GPT-2 from a
config). Before, each rank recorded its own local gradient from before DDP's all-reduce, and the scan then warned
that the ranks disagree on a healthy run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch.distributed")
from comgra.store import GroupReader

WORKER = Path(__file__).resolve().parent / "trainer_ddp_worker.py"
PARAMETER = "model.transformer.h.0.mlp.c_fc.weight"


@pytest.mark.slow
@pytest.mark.parametrize("accumulation", [1, 2])
def test_recorded_gradients_are_the_all_reduced_unclipped_ones(tmp_path: Path, accumulation: int) -> None:
    root, out = tmp_path / "root", tmp_path / "out"
    out.mkdir()
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(variable, None)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(WORKER), str(root), str(out), str(accumulation)],
                            env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trial = GroupReader(root / "group").trial("trial")
    for rank in (0, 1):
        expected = {int(step): values for step, values in json.loads((out / f"expected-r{rank}.json").read_text()).items()}
        assert sorted(expected) == [0, 1, 2, 3]
        for step, values in expected.items():
            (row,) = trial.selection(training_step=step, rank=rank, node=PARAMETER, kind="gradients").to_pylist()
            assert {k: row[k] for k in values} == pytest.approx(values, rel=1e-4), (rank, step)
    # The same all-reduced gradient on both ranks (the local ones differ: each rank saw other samples).
    for step in range(4):
        rows = [trial.selection(training_step=step, rank=rank, node=PARAMETER, kind="gradients").to_pylist()[0]
                for rank in (0, 1)]
        assert rows[0]["abs_mean"] == pytest.approx(rows[1]["abs_mean"], rel=1e-5)
