"""Dynamic recordings: decide at the end of a step whether, and which samples, to record."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from comgra.errors import RecordingError
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder

B = 8


def _dynamic_step(record_step, model_forward, recorder: ComgraRecorder, model: torch.nn.Module, step: int,
                  decision: str | None, categories: list[str], generator: torch.Generator) -> None:
    through_model = model_forward(model, torch.randn(B, 3, generator=generator))

    def forward(recorder: ComgraRecorder) -> torch.Tensor:
        assert recorder.recording_is_active()  # undecided: everything is kept until the decision
        loss = through_model(recorder)
        recorder.record_kpi_in_graph("loss", "train", loss.detach(), record_even_if_recording_is_inactive=True)
        return loss

    record_step(recorder, step, B, forward, decide=(decision, categories), type_of_execution=None)


CATEGORIES = ["hard", "easy", "easy", "hard", "easy", "medium", "easy", "hard"]
BALANCED = {
    # max_num_batch_size_to_record: (samples, categories), round-robin over sorted categories,
    # then sorted by (category, index)
    1: ([1], ["easy"]),
    3: ([1, 0, 5], ["easy", "hard", "medium"]),
    4: ([1, 2, 0, 5], ["easy", "easy", "hard", "medium"]),
    6: ([1, 2, 4, 0, 3, 5], ["easy", "easy", "easy", "hard", "hard", "medium"]),
    None: ([1, 2, 4, 6, 0, 3, 7, 5], ["easy"] * 4 + ["hard"] * 3 + ["medium"]),
}


@pytest.mark.parametrize(("limit", "expected"), BALANCED.items(), ids=[str(k) for k in BALANCED])
def test_balanced_samples_are_picked_per_category(limit, expected, make_recorder, record_step, model_forward,
                                                  open_trial, tiny_model, generator) -> None:
    recorder = make_recorder(policy=DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10),
                             max_num_batch_size_to_record=limit)
    recorder.track_module("model", tiny_model)
    _dynamic_step(record_step, model_forward, recorder, tiny_model, 0, "hard_cases", CATEGORIES, generator)
    recorder.finalize()
    trial = open_trial()
    (row, ) = trial.steps().to_pylist()
    samples, categories = expected
    assert (row["type_of_execution"], row["samples"], row["categories"]) == ("hard_cases", samples, categories)
    rows = trial.selection(training_step=0, node="y", kind="forward", aggregation="sample").to_pylist()
    assert sorted((r["sample"], r["category"]) for r in rows) == sorted(zip(samples, categories))
    gradient_rows = trial.selection(training_step=0, node="y", kind="gradients", aggregation="sample")
    assert sorted(gradient_rows["sample"].to_pylist()) == sorted(samples)


def test_batch_statistics_still_use_the_whole_batch(make_recorder, record_step, open_trial, tiny_model) -> None:
    recorder = make_recorder(policy=DecisionMakerForRecordingsFrequencyPerType(1), max_num_batch_size_to_record=2)
    recorder.track_module("model", tiny_model)
    x = torch.arange(B * 3, dtype=torch.float32).reshape(B, 3)

    def forward(recorder: ComgraRecorder) -> None:
        recorder.register_tensor("x", x, is_input=True)
        recorder.register_tensor("y", tiny_model(x))

    record_step(recorder, 0, B, forward, decide=("main", ["a"] * B), type_of_execution=None)
    recorder.finalize()
    (mean_row,) = open_trial().selection(training_step=0, node="x", aggregation="mean").to_pylist()
    assert mean_row["mean"] == pytest.approx(float(x.detach().mean()))


def test_unwanted_steps_store_nothing_but_their_kpis(make_recorder, record_step, model_forward, open_trial,
                                                      tiny_model, generator) -> None:
    recorder = make_recorder(policy=DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10))
    recorder.track_module("model", tiny_model)
    decisions = {0: "typical", 1: "typical", 2: None, 3: "rare", 11: "typical"}
    for step, decision in decisions.items():
        _dynamic_step(record_step, model_forward, recorder, tiny_model, step, decision, ["c"] * B, generator)
        assert not recorder.recording_is_active()
    recorder.finalize()
    trial = open_trial()
    assert [(r["training_step"], r["type_of_execution"]) for r in trial.steps().to_pylist()] == [
        (0, "typical"), (3, "rare"), (11, "typical")]
    for step in (1, 2):
        assert trial.selection(training_step=step).num_rows == 0
    kpis = trial.kpis()
    assert list(zip(kpis["timepoint"].to_pylist(), kpis["type_of_execution"].to_pylist())) == [
        (0, "typical"), (1, "typical"), (2, ""), (3, "rare"), (11, "typical")]


def test_declared_types_switch_undue_dynamic_steps_off_at_the_start(make_recorder, record_step, model_forward,
                                                                    open_trial, tiny_model, generator) -> None:
    recorder = make_recorder(policy=DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10))
    recorder.track_module("model", tiny_model)
    _dynamic_step(record_step, model_forward, recorder, tiny_model, 0, "only_type", ["c"] * B, generator)
    recorder.declare_that_all_different_types_of_execution_have_been_encountered()
    recorder.start_batch(1, B, type_of_execution=None)
    assert not recorder.recording_is_active()  # the only known type is not due before step 10
    recorder.decide_recording_of_batch("only_type", ["c"] * B)
    recorder.finish_batch()
    recorder.start_batch(10, B, type_of_execution=None)
    assert recorder.recording_is_active()
    with pytest.raises(RecordingError, match=r"'new_type' appeared after.*known types: \['only_type'\]"):
        recorder.decide_recording_of_batch("new_type", ["c"] * B)


def test_decision_must_agree_with_a_type_given_at_start(make_recorder) -> None:
    recorder = make_recorder({0})
    recorder.start_batch(0, B, type_of_execution="main")
    recorder.decide_recording_of_batch("main", ["c"] * B)  # consistent: a no-op
    with pytest.raises(RecordingError, match=r"decide_recording_of_batch\('other'\) disagrees"):
        recorder.decide_recording_of_batch("other", ["c"] * B)
