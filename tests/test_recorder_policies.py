"""Recording policies: which training steps get recorded, as in the original Comgra."""
from __future__ import annotations

import pytest

from comgra.objects import (
    DecisionMakerForRecordings,
    DecisionMakerForRecordingsFrequencyPerType,
    DecisionMakerForRecordingsHardcoded,
)


def recorded_steps(policy: DecisionMakerForRecordings, schedule: list[tuple[int, str]]) -> list[int]:
    """Ask the policy as the recorder does: once per step, and mark the steps it records."""
    recorded = []
    for step, type_of_execution in schedule:
        if policy.is_record_on_this_step(step, type_of_execution):
            policy.mark_recording_on_this_step(step, type_of_execution)
            recorded.append(step)
    return recorded


def one_type(steps: range, name: str = "main") -> list[tuple[int, str]]:
    return [(step, name) for step in steps]


FREQUENCY_CASES = {
    # name: (min_training_steps_difference, exponential_backoff_factor, schedule, recorded steps)
    "every_tenth_step": (10, 1.0, one_type(range(36)), [0, 10, 20, 30]),
    "first_step_need_not_be_zero": (10, 1.0, one_type(range(7, 40)), [7, 17, 27, 37]),
    "gap_zero_records_every_step": (0, 1.0, one_type(range(5)), [0, 1, 2, 3, 4]),
    "gap_one_records_every_step": (1, 1.0, one_type(range(5)), [0, 1, 2, 3, 4]),
    "sparse_steps_record_when_the_gap_is_reached": (10, 1.0, one_type(range(0, 50, 7)), [0, 14, 28, 42]),
    # The gap grows after each recording, the first one included: 20, 40, 80.
    "backoff_doubles_the_gap": (10, 2.0, one_type(range(200)), [0, 20, 60, 140]),
    "fractional_backoff": (10, 1.5, one_type(range(60)), [0, 15, 38]),
    "types_are_counted_apart": (4, 1.0, [(s, "even" if s % 2 == 0 else "odd") for s in range(10)],
                                [0, 1, 4, 5, 8, 9]),
    "a_rare_type_is_recorded_when_first_seen": (100, 1.0, [(0, "main"), (1, "main"), (2, "rare"), (3, "rare"),
                                                           (4, "other")], [0, 2, 4]),
}


@pytest.mark.parametrize(("gap", "factor", "schedule", "expected"), FREQUENCY_CASES.values(),
                         ids=FREQUENCY_CASES.keys())
def test_frequency_per_type(gap: int, factor: float, schedule: list[tuple[int, str]], expected: list[int]) -> None:
    policy = DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=gap,
                                                        exponential_backoff_factor=factor)
    assert recorded_steps(policy, schedule) == expected


def test_frequency_per_type_answers_repeated_questions_consistently() -> None:
    policy = DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10)
    assert policy.is_record_on_this_step(0, "main")
    assert policy.is_record_on_this_step(0, "main")  # asking does not count as recording
    policy.mark_recording_on_this_step(0, "main")
    assert policy.is_record_on_this_step(0, "main")  # the step that was recorded stays recorded
    assert not policy.is_record_on_this_step(9, "main")
    assert policy.is_record_on_this_step(10, "main")


def test_frequency_per_type_never_records_an_undecided_type() -> None:
    policy = DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=1)
    assert not policy.is_record_on_this_step(0, None)


def test_frequency_per_type_resumes_from_given_state() -> None:
    policy = DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=10, identifier_to_last_recorded_step_and_min_difference={"main": (100, 10)})
    assert recorded_steps(policy, one_type(range(101, 125))) == [110, 120]


def test_frequency_per_type_instances_share_no_state() -> None:
    """The original's mutable default dict made every policy remember every other's recordings."""
    first, second = (DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10) for _ in range(2))
    first.mark_recording_on_this_step(0, "main")
    assert not first.is_record_on_this_step(5, "main")
    assert second.is_record_on_this_step(5, "main")
    state = {"main": (0, 10)}
    third = DecisionMakerForRecordingsFrequencyPerType(10, identifier_to_last_recorded_step_and_min_difference=state)
    third.mark_recording_on_this_step(10, "main")
    assert state == {"main": (0, 10)}


HARDCODED_CASES = {
    # name: (fixed steps, schedule, recorded steps)
    "exactly_the_given_steps": ({0, 3, 7}, one_type(range(10)), [0, 3, 7]),
    "any_type": ({1, 2}, [(0, "a"), (1, "b"), (2, "c")], [1, 2]),
    "none": (set(), one_type(range(5)), []),
    "steps_never_reached": ({100}, one_type(range(5)), []),
    "list_input": ([4, 4, 2], one_type(range(5)), [2, 4]),
}


@pytest.mark.parametrize(("fixed", "schedule", "expected"), HARDCODED_CASES.values(), ids=HARDCODED_CASES.keys())
def test_hardcoded(fixed, schedule, expected) -> None:
    policy = DecisionMakerForRecordingsHardcoded(fixed)
    assert recorded_steps(policy, schedule) == expected
    assert recorded_steps(policy, schedule) == expected  # marking changes nothing


def test_custom_policy_subclass_is_accepted(make_recorder, tiny_model) -> None:
    class EveryThird(DecisionMakerForRecordings):
        def __init__(self) -> None:
            self.marked: list[tuple[int, str]] = []

        def is_record_on_this_step(self, training_step: int, type_of_execution: str | None) -> bool:
            return training_step % 3 == 0

        def mark_recording_on_this_step(self, training_step: int, type_of_execution: str) -> None:
            self.marked.append((training_step, type_of_execution))

    policy = EveryThird()
    recorder = make_recorder(policy=policy)
    recorder.track_module("model", tiny_model)
    active = []
    for step in range(7):
        recorder.start_batch(step, 1)
        active.append(recorder.recording_is_active())
        recorder.finish_batch()
    assert active == [step % 3 == 0 for step in range(7)]
    assert policy.marked == [(0, "main_execution_type"), (3, "main_execution_type"), (6, "main_execution_type")]


@pytest.mark.parametrize(("override", "expected"), [(True, [True, True, True]), (False, [False, False, False]),
                                                    (None, [True, False, True])])
def test_override_of_the_policy(override, expected, make_recorder) -> None:
    recorder = make_recorder({0, 2})
    active = []
    for step in range(3):
        recorder.start_batch(step, 1, override__recording_is_active=override)
        active.append(recorder.recording_is_active())
        recorder.finish_batch()
    assert active == expected
