"""The recorder's configuration, checked once at construction."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from comgra.errors import ConfigError
from comgra.objects import DecisionMakerForRecordings


@dataclass(frozen=True)
class RecorderOptions:
    root: Path
    group: str
    trial_id: str
    policy: DecisionMakerForRecordings
    max_samples: int | None
    visual_prefixes: tuple[str, ...]
    node_prefixes: tuple[str, ...]
    active: bool
    with_svd: bool
    max_neurons: int
    flush_seconds: float

    @property
    def group_dir(self) -> Path:
        return self.root / self.group

    @classmethod
    def create(cls, *, root: str | Path, group: str, trial_id: str, policy: DecisionMakerForRecordings,
               max_samples: int | None, visual_prefixes: list[str] | None, node_prefixes: list[str] | None,
               active: bool, with_svd: bool, max_neurons: int, flush_seconds: float) -> RecorderOptions:
        for name, value in (("group", group), ("trial_id", trial_id)):
            if not isinstance(value, str) or not value or "/" in value or "\\" in value or value.startswith("."):
                raise ConfigError(f"{name}={value!r} must be a non-empty folder name without '/' or a leading '.', "
                                  "e.g. 'trial_1'.")
        if not isinstance(policy, DecisionMakerForRecordings):
            raise ConfigError(f"decision_maker_for_recordings={policy!r} is not a policy; pass e.g. "
                              "DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=100) "
                              "from comgra.objects.")
        if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 0):
            raise ConfigError(f"max_num_batch_size_to_record={max_samples!r} must be None (all samples) or an int >= 0.")
        if not isinstance(max_neurons, int) or max_neurons < 0:
            raise ConfigError(f"max_num_neurons_to_record={max_neurons!r} must be an int >= 0, e.g. 256.")
        visual = tuple(visual_prefixes) if visual_prefixes is not None else ("",)
        for i, prefix in enumerate(visual):
            if any(prefix.startswith(earlier) and prefix != earlier for earlier in visual[:i]):
                raise ConfigError(f"prefixes_for_grouping_module_parameters_visually={list(visual)}: {prefix!r} comes "
                                  "after a shorter prefix that already matches it; list more specific prefixes first.")
        return cls(Path(root).expanduser().resolve(), group, trial_id, policy, max_samples, visual,
                   tuple(node_prefixes or ()), active, with_svd, max_neurons, flush_seconds)
