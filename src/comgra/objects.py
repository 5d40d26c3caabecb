"""Recording policies: which training steps get recorded.

Kept at this import path for compatibility with the original Comgra
(``from comgra.objects import DecisionMakerForRecordingsFrequencyPerType``).
No torch here: a policy decides from the step number and the type of execution alone.
"""
from __future__ import annotations

import abc
from collections.abc import Iterable

from comgra.errors import ConfigError

__all__ = [
    "DecisionMakerForRecordings",
    "DecisionMakerForRecordingsFrequencyPerType",
    "DecisionMakerForRecordingsHardcoded",
]


class DecisionMakerForRecordings(abc.ABC):
    """Decides per ``(training_step, type_of_execution)`` whether a step is recorded.

    Subclass it for a policy of your own: ``is_record_on_this_step`` is asked at
    ``start_batch`` (and again at ``decide_recording_of_batch`` for dynamic
    recordings); ``mark_recording_on_this_step`` is told when a step was recorded.
    """

    @abc.abstractmethod
    def is_record_on_this_step(self, training_step: int, type_of_execution: str | None) -> bool:
        """True if this step should be recorded."""

    def mark_recording_on_this_step(self, training_step: int, type_of_execution: str) -> None:
        """Called once for every step that was recorded."""


class DecisionMakerForRecordingsHardcoded(DecisionMakerForRecordings):
    """Records exactly the given training steps, whatever their type.

    >>> DecisionMakerForRecordingsHardcoded({0, 10}).is_record_on_this_step(10, "main")
    True
    """

    def __init__(self, fixed_training_steps: Iterable[int]):
        self.fixed_training_steps = set(fixed_training_steps)

    def is_record_on_this_step(self, training_step: int, type_of_execution: str | None) -> bool:
        return type_of_execution is not None and training_step in self.fixed_training_steps


class DecisionMakerForRecordingsFrequencyPerType(DecisionMakerForRecordings):
    """Records each type of execution at least ``min_training_steps_difference`` steps apart.

    A type seen for the first time is recorded at once. After each recording the
    gap is multiplied by ``exponential_backoff_factor`` (1.0 keeps it constant),
    so a run can record densely at the start and sparsely later.

    >>> policy = DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10)
    >>> policy.is_record_on_this_step(0, "main")
    True
    """

    def __init__(
        self,
        min_training_steps_difference: int,
        exponential_backoff_factor: float = 1.0,
        identifier_to_last_recorded_step_and_min_difference: dict[str, tuple[int, float]] | None = None,
    ):
        if min_training_steps_difference < 0:
            raise ConfigError(
                f"min_training_steps_difference={min_training_steps_difference!r} is negative; "
                "give the smallest number of steps between two recordings of the same type, e.g. 100."
            )
        if exponential_backoff_factor < 1.0:
            raise ConfigError(
                f"exponential_backoff_factor={exponential_backoff_factor!r} is below 1.0; "
                "use 1.0 for a constant gap or a larger value to record less often over time."
            )
        self.min_training_steps_difference = min_training_steps_difference
        self.exponential_backoff_factor = exponential_backoff_factor
        # A fresh dict per instance: the original shared one mutable default between all policies.
        self.identifier_to_last_recorded_step_and_min_difference = dict(
            identifier_to_last_recorded_step_and_min_difference or {}
        )

    def is_record_on_this_step(self, training_step: int, type_of_execution: str | None) -> bool:
        if type_of_execution is None:
            return False
        last = self.identifier_to_last_recorded_step_and_min_difference.get(type_of_execution)
        if last is None:
            return True
        last_step, gap = last
        return training_step == last_step or training_step >= last_step + gap

    def mark_recording_on_this_step(self, training_step: int, type_of_execution: str) -> None:
        last = self.identifier_to_last_recorded_step_and_min_difference.get(type_of_execution)
        if last is not None and last[0] == training_step:
            return  # the same step marked twice counts once
        # As in the original, the gap grows after every recording, the first one included.
        gap = (float(self.min_training_steps_difference) if last is None else last[1]) * self.exponential_backoff_factor
        self.identifier_to_last_recorded_step_and_min_difference[type_of_execution] = (training_step, gap)
