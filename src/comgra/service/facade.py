"""``RecordingService``: the one object the app and the REST API ask, so that they never disagree.

It composes the questions, one part per kind (``trials``, ``steps``, ``panels``, ``findings``,
``live``, and ``resolve`` for the tensors page), and hands every question to the part that answers
it: the parts know nothing of each other beyond what they are given, and none of them knows this
facade. Nothing here imports Dash or torch, keeps per-user state, or loads a whole recording.

    >>> service = RecordingService("/path/to/root/group")                            # doctest: +SKIP
    >>> view = service.resolve({"node_id": "input", "aggregation": "sample:0"})      # doctest: +SKIP
    >>> view.row["mean"], view.notices                                               # doctest: +SKIP
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from comgra.analysis.findings import Finding, ScanOptions
from comgra.service.findings import FindingQuestions, FindingsProgress
from comgra.service.health import TrainingHealth, training_health
from comgra.service.live import DEFAULT_HISTORY, LiveQuestions
from comgra.service.panels import Comparison, NeuronValues, PanelQuestions, SampleColumn, SamplesTable
from comgra.service.resolve import resolve
from comgra.service.runs import GroupBand, RunPage, RunQuestions
from comgra.service.selection import Selection, View
from comgra.service.steps import StepIndex, StepReads
from comgra.service.trials import TrialQuestions
from comgra.store import format as fmt
from comgra.store.reader import GroupReader, TrialReader


class RecordingService:
    """Answers from one group folder. Thread-safe; holds caches only, never a user's state."""

    def __init__(self, path: str | Path):
        self.group = GroupReader(path)
        self.trial_questions = TrialQuestions(self.group)
        self.step_reads = StepReads(self.trial_questions)
        self.panel_questions = PanelQuestions(self.trial_questions, self.step_reads)
        self.finding_questions = FindingQuestions(self.group)
        self.live_questions = LiveQuestions(self.trial_questions)
        self.run_questions = RunQuestions(self.trial_questions, lambda: self.finding_questions.findings_options)

    def close(self) -> None:
        """Let go of the store's connections (DuckDB reports those still alive at exit as leaks)."""
        self.finding_questions.close_findings()  # the background scanner takes no new trial (issue 8)
        self.step_reads.close()
        self.group.close()

    # -- trials ------------------------------------------------------------------------------------
    def trials(self) -> list[str]:
        return self.trial_questions.trials()

    def data_version(self) -> str:
        return self.trial_questions.data_version()

    def trial(self, trial_id: str) -> TrialReader:
        return self.trial_questions.trial(trial_id)

    def notes(self, trial_id: str) -> list[str]:
        return self.trial_questions.notes(trial_id)

    def kpis(self, trial_id: str) -> pa.Table:
        return self.trial_questions.kpis(trial_id)

    def modules(self, trial_id: str) -> list[dict[str, Any]]:
        return self.trial_questions.modules(trial_id)

    def problems(self, trial_id: str) -> list[str]:
        return self.trial_questions.problems(trial_id)

    def breakpoint_targets(self, trial_id: str) -> list[str]:
        return self.trial_questions.breakpoint_targets(trial_id)

    def ranks(self, trial_id: str) -> list[int]:
        return self.trial_questions.ranks(trial_id)

    # -- runs of a sweep (the Runs view, GET /api/v1/runs) ---------------------------------------------
    def runs(self, *, filter: str | None = None, sort: str | None = None, offset: int = 0,
             limit: int | None = None) -> RunPage:
        return self.run_questions.page(filter=filter, sort=sort, offset=offset, limit=limit)

    def run_group_bands(self, trials: list[str], by: str, kpi: str) -> list[GroupBand]:
        return self.run_questions.group_bands(trials, by, kpi)

    # -- steps and the tensors page ----------------------------------------------------------------
    def resolve(self, wanted: Mapping[str, Any]) -> View:
        return resolve(self.trial_questions, self.step_reads, wanted)

    def step_index(self, trial_id: str, rank: int | None = None) -> StepIndex:
        return self.step_reads.step_index(trial_id, rank)

    def statistic_series(self, trial_id: str, selection: Selection, statistic: str,
                         rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self.step_reads.statistic_series(trial_id, selection, statistic, rank)

    def tensor_rows(self, trial_id: str, training_step: int, **filters: Any) -> pa.Table:
        return self.step_reads.tensor_rows(trial_id, training_step, **filters)

    def step_rows(self, trial_id: str, training_step: int, rank: int, type_of_execution: str | None = None) -> pa.Table:
        return self.step_reads.step_rows(trial_id, training_step, rank, type_of_execution)

    def prefetch_near(self, selection: Selection) -> None:
        self.step_reads.prefetch_near(selection)

    # -- panels ------------------------------------------------------------------------------------
    def node_summaries(self, trial_id: str, training_step: int, iteration: int, *, kind: str = fmt.FORWARD,
                       rank: int = 0, type_of_execution: str | None = None) -> dict[str, dict[str, float | None]]:
        return self.panel_questions.node_summaries(trial_id, training_step, iteration, kind=kind, rank=rank,
                                                   type_of_execution=type_of_execution)

    def step_row(self, trial_id: str, training_step: int, iteration: int, rank: int = 0,
                 type_of_execution: str | None = None) -> dict[str, Any]:
        return self.panel_questions.step_row(trial_id, training_step, iteration, rank, type_of_execution)

    def graph_at(self, trial_id: str, training_step: int, iteration: int, rank: int = 0,
                 type_of_execution: str | None = None) -> fmt.GraphDocument:
        return self.panel_questions.graph_at(trial_id, training_step, iteration, rank, type_of_execution)

    def adjacent_step(self, trial_id: str, type_of_execution: str, training_step: int, *, offset: int = 0,
                      index: int | None = None, rank: int | None = 0) -> int | None:
        return self.panel_questions.adjacent_step(trial_id, type_of_execution, training_step, offset=offset,
                                                  index=index, rank=rank)

    def adjacent_position(self, trial_id: str, type_of_execution: str, training_step: int, *, offset: int = 0,
                          index: int | None = None, rank: int | None = 0,
                          step_type: str | None = None) -> tuple[int, str] | None:
        return self.panel_questions.adjacent_position(trial_id, type_of_execution, training_step, offset=offset,
                                                      index=index, rank=rank, step_type=step_type)

    def neuron_values(self, selection: Selection) -> NeuronValues:
        return self.panel_questions.neuron_values(selection)

    def selection_row(self, selection: Selection) -> dict[str, Any] | None:
        return self.panel_questions.selection_row(selection)

    def compare(self, pinned: Selection, current: Selection) -> Comparison:
        return self.panel_questions.compare(pinned, current)

    def counterpart(self, selection: Selection, *, trial: str | None = None, training_step: int | None = None) -> View:
        return self.panel_questions.counterpart(selection, trial=trial, training_step=training_step)

    def sample_columns(self, trial_id: str, training_step: int, iteration: int, *, rank: int = 0,
                       type_of_execution: str | None = None) -> list[SampleColumn]:
        return self.panel_questions.sample_columns(trial_id, training_step, iteration, rank=rank,
                                                   type_of_execution=type_of_execution)

    def samples_table(self, trial_id: str, training_step: int, iteration: int, columns: list[SampleColumn], *,
                      rank: int = 0, type_of_execution: str | None = None) -> SamplesTable:
        return self.panel_questions.samples_table(trial_id, training_step, iteration, columns, rank=rank,
                                                  type_of_execution=type_of_execution)

    # -- findings ----------------------------------------------------------------------------------
    def configure_findings(self, *, sensitivity: float | None = None, background: bool = True,
                           in_child: bool = False) -> None:
        self.finding_questions.configure_findings(sensitivity=sensitivity, background=background, in_child=in_child)

    @property
    def findings_options(self) -> ScanOptions:
        return self.finding_questions.findings_options

    def findings(self, trial_id: str | None = None, options: ScanOptions | None = None) -> list[Finding]:
        return self.finding_questions.findings(trial_id, options)

    def findings_progress(self, trial_id: str | None = None, wait_seconds: float = 0.0) -> FindingsProgress:
        return self.finding_questions.findings_progress(trial_id, wait_seconds)

    def answering(self) -> Any:
        """A context manager around an answer for a person (the app wraps each request in it): the background
        findings scan starts no trial while one runs, nor for a quarter of a second after (at most 2 s per trial)."""
        return self.finding_questions.answering()

    def findings_version(self, trial_id: str | None = None) -> int:
        return self.finding_questions.findings_version(trial_id)

    def finding_badges(self, trial_id: str, wait_seconds: float = 0.0) -> dict[str, str]:
        return self.finding_questions.finding_badges(trial_id, wait_seconds)

    def finding_documents(self, trial_id: str | None = None) -> list[dict[str, Any]]:
        return self.finding_questions.finding_documents(trial_id)

    def training_health(self, trial_id: str, wait_seconds: float = 0.0) -> TrainingHealth:
        """Gradient norms per layer over the steps, sentinel events, findings by node (``service.health``); the
        trial's findings are those scanned so far (queued for a scan, waited for at most ``wait_seconds``)."""
        self.findings_version(trial_id)
        progress = self.findings_progress(trial_id, wait_seconds)
        return training_health(self.trial(trial_id), progress.findings, pending=trial_id in progress.pending)

    # -- live: profiling and resources -------------------------------------------------------------
    def layer_table(self, trial_id: str, *, rank: int | None = None) -> pa.Table:
        return self.live_questions.layer_table(trial_id, rank=rank)

    def layer_rows(self, trial_id: str, *, rank: int | None = None, first_step: int | None = None,
                   last_step: int | None = None, execution: str | None = None) -> list[dict[str, Any]]:
        return self.live_questions.layer_rows(trial_id, rank=rank, first_step=first_step, last_step=last_step,
                                              execution=execution)

    def layer_types(self, trial_id: str) -> list[str]:
        return self.live_questions.layer_types(trial_id)

    def layers(self, trial_id: str) -> list[dict[str, Any]]:
        return self.live_questions.layers(trial_id)

    def layer_history(self, trial_id: str, module: str, *, limit: int = DEFAULT_HISTORY) -> list[dict[str, Any]]:
        return self.live_questions.layer_history(trial_id, module, limit=limit)

    def profile_summary(self, trial_id: str, phase: str = "forward", *, limit: int | None = None,
                        first_step: int | None = None, last_step: int | None = None,
                        execution: str | None = None) -> list[dict[str, Any]]:
        return self.live_questions.profile_summary(trial_id, phase, limit=limit, first_step=first_step,
                                                   last_step=last_step, execution=execution)

    def flame_graph(self, trial_id: str, phase: str = "forward", *, first_step: int | None = None,
                    last_step: int | None = None, execution: str | None = None) -> list[dict[str, Any]]:
        return self.live_questions.flame_graph(trial_id, phase, first_step=first_step, last_step=last_step,
                                               execution=execution)

    def chrome_trace(self, trial_id: str, *, first_step: int | None = None,
                     last_step: int | None = None, execution: str | None = None) -> dict[str, Any]:
        return self.live_questions.chrome_trace(trial_id, first_step=first_step, last_step=last_step,
                                                execution=execution)

    def resource_status(self, trial_id: str) -> list[dict[str, Any]]:
        return self.live_questions.resource_status(trial_id)

    def resource_series(self, trial_id: str) -> list[dict[str, Any]]:
        return self.live_questions.resource_series(trial_id)

    def resources(self, trial_id: str) -> dict[str, Any]:
        return self.live_questions.resources(trial_id)
