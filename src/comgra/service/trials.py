"""The small questions about the trials of a group: which trials and ranks, their notes, KPIs, module
trees and problems (damaged chunks that were skipped). No torch, no Dash.

    >>> TrialQuestions(GroupReader("/path/to/root/group")).trials()  # doctest: +SKIP
    ['trial_a', 'trial_b']
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from comgra.errors import StoreError
from comgra.service.changes import GroupChanges, Poll
from comgra.store import format as fmt
from comgra.store import layout
from comgra.store.reader import GroupReader, TrialReader


class TrialQuestions:
    """Answers about whole trials of one group folder, read through its ``GroupReader``."""

    def __init__(self, group: GroupReader):
        self.group = group
        self.changes = GroupChanges(group)

    def trials(self) -> list[str]:
        return self.group.trials()

    def data_version(self) -> str:
        """A cheap token that changes whenever a run adds a trial or a chunk; compare, don't parse. One listing
        of the trials folder, chunks listed only of the trials a writer holds (``service.changes``)."""
        return self.changes.poll().version

    def poll(self) -> Poll:
        """What changed since the last look, and every trial's state (``service.changes``)."""
        return self.changes.poll()

    def trial(self, trial_id: str) -> TrialReader:
        return self.group.trial(trial_id)

    def notes(self, trial_id: str) -> list[str]:
        return self.trial(trial_id).notes()

    def kpis(self, trial_id: str) -> pa.Table:
        return self.trial(trial_id).kpis()

    def modules(self, trial_id: str) -> list[dict[str, Any]]:
        """The tracked module trees with ``total`` (parameters of the subtree) added to every module."""
        return [_with_totals(tree) for tree in self.trial(trial_id).metadata.get("modules") or []]

    def problems(self, trial_id: str) -> list[str]:
        """Messages for a banner: damaged chunks that were skipped, an unreadable trial."""
        try:
            trial = self.trial(trial_id)
        except StoreError as error:
            return [str(error)]
        return [f"Skipped {layout.chunk_label(Path(p))} of trial {trial_id!r}: {reason}. "
                "The rest of the trial is shown." for p, reason in trial.problem_reasons().items()]

    def ranks(self, trial_id: str) -> list[int]:
        """The ranks that recorded steps of the trial (``[0]`` for a single process, also before anything is
        flushed). Read from the steps chunks' names, as ``step_index`` does on every view: no more listing."""
        names = self.trial(trial_id).chunk_names("steps")
        return sorted({rank for name in names if (rank := fmt.rank_of(name)) is not None}) or [0]

    def breakpoint_targets(self, trial_id: str) -> list[str]:
        """The names a breakpoint of this trial can watch, as far as the recording knows them: the tensors
        registered in any recorded graph (parameters are not targets) and the tracked modules. Empty while no
        graph is recorded yet (the tensors are not known then); a graph that cannot be read is left out."""
        trial = self.trial(trial_id)
        names: set[str] = set()
        for rank in self.ranks(trial_id):
            for graph_hash in set(trial.steps(rank).column("graph").to_pylist()):
                try:
                    graph = trial.graph(graph_hash)
                except StoreError:
                    continue
                names.update(n["id"] for n in graph["nodes"] if n.get("role") != "parameter")
        if not names:
            return []
        stack = list(trial.metadata.get("modules") or [])
        while stack:
            module = stack.pop()
            names.add(str(module.get("full_name") or module.get("name")))
            stack.extend(module.get("submodules") or [])
        return sorted(names)


# -- module trees -------------------------------------------------------------
def _with_totals(tree: Mapping[str, Any]) -> dict[str, Any]:
    submodules = [_with_totals(child) for child in tree.get("submodules") or []]
    # A tied parameter (tied_to its first name) is counted once, where it is met first.
    own = sum(int(p.get("numel") or 0) for p in tree.get("parameters") or [] if not p.get("tied_to"))
    return {**tree, "submodules": submodules, "own": own, "total": own + sum(s["total"] for s in submodules)}
