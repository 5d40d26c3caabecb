"""The recorder's configuration, checked once at construction."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comgra.errors import ConfigError
from comgra.objects import DecisionMakerForRecordings
from comgra.store.spool import recording_root


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
    record_ranks: frozenset[int] | None = None  # None: every rank of a torch.distributed run records
    remote: str | None = None  # a URL root: ``root`` is its node-local spool, uploaded there (store.spool)
    settings: Any = field(default=None, compare=False)  # comgra.toml's settings, for the upload of a URL root

    @property
    def group_dir(self) -> Path:
        return self.root / self.group

    @property
    def remote_group(self) -> str | None:
        """The URL the group folder is uploaded to, or None for a local root."""
        return None if self.remote is None else f"{self.remote}/{self.group}"

    def records_rank(self, rank: int) -> bool:
        return self.record_ranks is None or rank in self.record_ranks

    @property
    def lead_rank(self) -> int:
        """The lowest recording rank: it writes trial.json, so a trial exists even when rank 0 does not record."""
        return 0 if self.record_ranks is None else min(self.record_ranks, default=0)

    @classmethod
    def create(cls, *, root: str | Path, group: str, trial_id: str, policy: DecisionMakerForRecordings,
               max_samples: int | None, visual_prefixes: list[str] | None, node_prefixes: list[str] | None,
               active: bool, with_svd: bool, max_neurons: int, flush_seconds: float,
               record_ranks: str | Iterable[int] = "all", settings: Any = None) -> RecorderOptions:
        for name, value in (("group", group), ("trial_id", trial_id)):
            if not isinstance(value, str) or not value or "/" in value or "\\" in value or value.startswith("."):
                raise ConfigError(f"{name}={value!r} must be a non-empty folder name without '/' or a leading '.', "
                                  "e.g. 'trial_1'.")
            if not _is_folder_name(value):
                raise ConfigError(f"{name}={value[:40]!r} cannot be a folder name: it holds a NUL character or a "
                                  "lone surrogate, or is longer than 255 bytes in UTF-8. Choose a shorter, plain name.")
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
        where = recording_root(root, settings)  # a URL: its spool folder; a bad URL fails here, before any folder
        return cls(where.local, group, trial_id, policy, max_samples, visual,
                   tuple(node_prefixes or ()), active, with_svd, max_neurons, flush_seconds,
                   _parse_record_ranks(record_ranks), where.url, settings)


def _parse_record_ranks(value: str | Iterable[int]) -> frozenset[int] | None:
    """``"all"`` -> None (every rank), ``"zero"`` -> {0}, a collection of ranks -> those ranks."""
    if value == "all":
        return None
    if value == "zero":
        return frozenset({0})
    ranks = list(value) if isinstance(value, (list, tuple, set, frozenset, range)) else None
    if not ranks or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise ConfigError(f"record_ranks={value!r} is not usable; pass 'all' (every rank of a torch.distributed "
                          "run records), 'zero' (rank 0 only) or a non-empty list of ranks >= 0, e.g. [0, 1].")
    return frozenset(ranks)


def _is_folder_name(value: str) -> bool:
    """What every common filesystem holds as one folder name (ext4, APFS and NTFS allow 255 bytes or more)."""
    try:
        return "\0" not in value and len(value.encode("utf-8")) <= 255
    except UnicodeEncodeError:  # a lone surrogate
        return False
