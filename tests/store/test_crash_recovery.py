"""A run killed with SIGKILL leaves a readable recording of every step it flushed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store import layout

pytest.importorskip("torch")

TRAINING_SCRIPT = textwrap.dedent('''
    import sys, time
    import torch
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder

    torch.manual_seed(0)
    recorder = ComgraRecorder(sys.argv[1], "group", "trial",
                              DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=1),
                              flush_seconds=0.02)
    model = torch.nn.Linear(3, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    recorder.track_module("model", model)
    step = 0
    while True:  # until killed
        recorder.start_batch(step, 4)
        memory = torch.zeros(4, 3)
        recorder.register_tensor("initial_memory", memory, is_initial_value=True)
        for iteration in range(2):
            recorder.start_iteration()
            x = torch.randn(4, 3)
            recorder.register_tensor("x", x, is_input=True)
            memory = model(x) + memory
            recorder.register_tensor("memory", memory)
            if iteration == 1:
                loss = memory.pow(2).mean()
                recorder.register_tensor("loss", loss, is_loss=True)
                recorder.record_kpi_in_graph("loss", "", loss, record_even_if_recording_is_inactive=True)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
        recorder.add_note(f"step {step}")
        recorder.finish_batch()
        step += 1
        time.sleep(0.002)
''')


def _flushed_steps_chunks(trial_dir: Path) -> int:
    folder = layout.rank_dir(trial_dir, "steps", 0)
    return len([p for p in folder.glob("*.parquet") if not p.name.startswith(".")]) if folder.is_dir() else 0


@pytest.mark.slow
def test_sigkill_mid_training_leaves_every_flushed_step_readable(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAINING_SCRIPT)
    root = tmp_path / "root"
    trial_dir = fmt.trial_dir(root / "group", "trial")
    process = subprocess.Popen([sys.executable, str(script), str(root)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while _flushed_steps_chunks(trial_dir) < 4:
            assert process.poll() is None, process.communicate()[1].decode()
            assert time.monotonic() < deadline, "the training process flushed nothing within 60 s"
            time.sleep(0.02)
        time.sleep(0.03)  # kill it while it trains and writes
    finally:
        os.kill(process.pid, signal.SIGKILL)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert b"Traceback" not in stderr, stderr.decode()

    for table in fmt.TABLES:  # a half-written chunk, as a kill during a write leaves it
        (layout.rank_dir(trial_dir, table, 0)).mkdir(parents=True, exist_ok=True)
        (layout.rank_dir(trial_dir, table, 0) / ".tmp-killed.parquet").write_bytes(b"PAR1 half written")

    trial = GroupReader(root / "group").trial("trial")
    index = trial.steps().to_pylist()
    steps = sorted({row["training_step"] for row in index})
    assert len(steps) >= 4
    assert steps == list(range(len(steps)))  # every step up to the last flush, none missing
    for step in steps:
        rows = [r for r in index if r["training_step"] == step]
        assert [r["iteration"] for r in rows] == [0, 1]
        assert all(r["kinds"] == ["forward", "gradients"] for r in rows)
        tensors = trial.selection(training_step=step, columns=["kind", "iteration", "node"]).to_pylist()
        found = {(t["kind"], t["iteration"], t["node"]) for t in tensors}
        for iteration in (0, 1):
            assert {("forward", iteration, "x"), ("forward", iteration, "memory"),
                    ("gradients", iteration, "memory")} <= found, (step, iteration)
        assert {("forward", -1, "model.weight"), ("gradients", -1, "model.weight"),
                ("forward", 1, "loss")} <= found
        for row in rows:
            assert trial.graph(row["graph"])["edges"]
    assert trial.problems == []
    assert trial.metadata["format_version"] == fmt.FORMAT_VERSION
    assert set(trial.notes()) >= {f"step {s}" for s in steps}
