"""Writes the golden recording of format_version 1 in ``tests/golden/format_v1/``.

Run once, when a format version is released, and commit the output as data:

    python tests/golden/make_format_v1.py

Never regenerate it for a later version: the reader must keep opening what this
version wrote (tests/store/test_golden.py). A new format version gets a new script
and a new folder next to this one.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from comgra.objects import DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

HERE = Path(__file__).resolve().parent
ROOT = HERE / "format_v1"


def main() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir()
    recorder = ComgraRecorder(ROOT, "golden_group", "golden_trial", DecisionMakerForRecordingsHardcoded({0, 2}),
                              max_num_batch_size_to_record=2, max_num_neurons_to_record=4,
                              prefixes_for_grouping_module_parameters_in_nodes=["model.cell"],
                              flush_seconds=60.0)
    model = torch.nn.Module()
    model.cell = torch.nn.Linear(2 + 2, 2)
    model.readout = torch.nn.Linear(2, 1)
    with torch.no_grad():  # exact, human-checkable values
        model.cell.weight.copy_(torch.tensor([[0.5, 0.0, 0.25, 0.0], [0.0, -0.5, 0.0, 0.25]]))
        model.cell.bias.copy_(torch.tensor([0.125, -0.125]))
        model.readout.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.readout.bias.zero_()
    recorder.track_module("model", model)
    recorder.add_note("golden recording of format_version 1")
    for step in range(3):
        recorder.start_batch(step, 3, type_of_execution="02_iterations")
        memory = torch.zeros(3, 2)
        recorder.register_tensor("initial_memory", memory, is_initial_value=True)
        for iteration in range(2):
            recorder.start_iteration()
            x = torch.arange(6, dtype=torch.float32).reshape(3, 2) + 10 * iteration + 100 * step
            recorder.register_tensor("x", x, is_input=True)
            recorder.register_tensor("helper__double", x * 2, node_name="helper", role_within_node="double")
            recorder.register_tensor("helper__negative", -x, node_name="helper", role_within_node="negative")
            memory = model.cell(torch.cat([x, memory], dim=1))
            recorder.register_tensor("memory", memory)
            if iteration == 1:
                y = model.readout(memory)
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


if __name__ == "__main__":
    main()
