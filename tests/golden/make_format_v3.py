"""Writes the golden recording of format_version 3 in ``tests/golden/format_v3/``.

Format 3 moves every table out of the trial folder into a Hive-partitioned dataset per table
(``GROUP/<table>/trial=<id>/rank=<r>/<chunk>.parquet``, no ``rank`` column in the files, runinfo's ``value``
named ``text`` and sentinels' ``abs_max`` named ``abs_max_f64``), and compacts each table of a finished rank
into one file. The recording holds two ranks of one trial, as two processes of ``torchrun
--nproc_per_node=2`` would write it (the script plays both ranks in turn through torchrun's environment
variables). Run once, when the version is released, and
commit the output as data:

    python tests/golden/make_format_v3.py

Never regenerate it for a later version (see make_format_v1.py).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

HERE = Path(__file__).resolve().parent
ROOT = HERE / "format_v3"


def record_rank(rank: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    recorder = ComgraRecorder(ROOT, "golden_group", "golden_trial", DecisionMakerForRecordingsHardcoded({0, 2}),
                              max_num_batch_size_to_record=2, max_num_neurons_to_record=4, flush_seconds=60.0)
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():  # exact, human-checkable values
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.zero_()
    recorder.track_module("model", model)
    recorder.add_note(f"golden recording of format_version 3, rank {rank}")
    for step in range(3):
        recorder.start_batch(step, 3, type_of_execution="main")
        recorder.start_iteration()
        # Each rank sees its own data, as under DDP: rank r adds 1000 * r.
        x = torch.arange(6, dtype=torch.float32).reshape(3, 2) + 100 * step + 1000 * rank
        recorder.register_tensor("x", x, is_input=True)
        y = model(x)
        recorder.register_tensor("y", y)
        loss = y.mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.record_kpi_in_graph("loss", "mean", loss, record_even_if_recording_is_inactive=True)
        recorder.finish_iteration()
        recorder.finish_batch()
        model.zero_grad()
    recorder.finalize()


def main() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir()
    for rank in (0, 1):
        record_rank(rank)
    for leftover in ROOT.rglob(".*"):  # the writers' lock files: state of a live run, not part of the format
        leftover.unlink()


if __name__ == "__main__":
    main()
