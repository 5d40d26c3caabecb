"""``recorder.flush()``: a run in progress is readable up to now, KPI points included.

The writer's own interval (``flush_seconds``) is set far beyond the test, so whatever a reader sees
before ``finalize`` was written by ``flush``.
"""
from __future__ import annotations

import pytest

from comgra.store import TrialReader
from comgra.store import format as fmt
torch = pytest.importorskip("torch")

GROUP, TRIAL = "group", "trial"  # make_recorder's defaults (tests/conftest.py)


def _forward(model):
    def forward(recorder):
        x = torch.ones(2, 3)
        recorder.register_tensor("x", x, is_input=True)
        loss = model(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.record_kpi_in_graph("loss", "", loss, record_even_if_recording_is_inactive=True)
        return loss
    return forward


def _readable(store_root) -> tuple[list[int], list[int]]:
    """The recorded steps and the KPI timepoints a fresh reader sees now."""
    reader = TrialReader(fmt.trial_dir(store_root / GROUP, TRIAL))
    return reader.steps()["training_step"].to_pylist(), sorted(reader.kpis()["timepoint"].to_pylist())


def test_flush_makes_the_run_so_far_readable(make_recorder, store_root, tiny_model, record_step) -> None:
    recorder = make_recorder({0, 2}, flush_seconds=3600, resource_seconds=None)
    recorder.track_module("model", tiny_model)
    for step in range(3):
        record_step(recorder, step, 2, _forward(tiny_model))
    assert _readable(store_root) == ([], []), "the writer wrote on its own: this test would prove nothing"

    recorder.flush()
    assert _readable(store_root) == ([0, 2], [0, 1, 2])

    record_step(recorder, 3, 2, _forward(tiny_model))
    recorder.flush()
    assert _readable(store_root) == ([0, 2], [0, 1, 2, 3])
    recorder.finalize()
    recorder.flush()  # after finalize: nothing to do, no error
    assert _readable(store_root) == ([0, 2], [0, 1, 2, 3])


def test_flush_keeps_the_points_of_a_step_whose_type_is_not_decided(make_recorder, store_root, tiny_model) -> None:
    """A dynamic step learns its type at decide_recording_of_batch: its KPI points wait for it."""
    recorder = make_recorder({0}, flush_seconds=3600, resource_seconds=None)
    recorder.track_module("model", tiny_model)
    recorder.start_batch(0, 2, type_of_execution=None)
    recorder.start_iteration()
    recorder.record_kpi_in_graph("loss", "", 1.0)
    recorder.flush()
    assert _readable(store_root)[1] == []
    recorder.finish_iteration()
    recorder.decide_recording_of_batch("train", ["a", "b"])
    recorder.finish_batch()
    recorder.flush()
    kpis = TrialReader(fmt.trial_dir(store_root / GROUP, TRIAL)).kpis()
    assert kpis["type_of_execution"].to_pylist() == ["train"]


def test_flush_without_recording_does_nothing(make_recorder) -> None:
    make_recorder(comgra_is_active=False).flush()
