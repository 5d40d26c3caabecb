"""The panels' data questions, answered as plain data: the graph's hover cards, the samples table and its
column choices, a tensor's stored values, step navigation, a comparison of two selections. No torch, no Dash.

    >>> service.samples_table("trial_a", 40, 2, [SampleColumn("loss_per_sample", "loss_per_sample")])  # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from comgra.errors import SelectionError, did_you_mean
from comgra.service.resolve import node_data_iteration, resolve
from comgra.service.selection import ANY_TYPE, PLOT_STATISTICS, Selection, View, parse_aggregation
from comgra.service.steps import StepReads
from comgra.service.trials import TrialQuestions
from comgra.store import format as fmt


class PanelQuestions:
    """The panels' questions about the trials of one group, read through the service's ``StepReads``."""

    def __init__(self, trials: TrialQuestions, reads: StepReads):
        self._trials = trials
        self._reads = reads

    # -- the tensors page -----------------------------------------------------------------------------
    def node_summaries(self, trial_id: str, training_step: int, iteration: int, *, kind: str = fmt.FORWARD,
                       rank: int = 0, type_of_execution: str | None = None) -> dict[str, dict[str, float | None]]:
        """min / mean / max of every node of one iteration (its first role; the batch mean of a tensor with a
        batch dimension), for the graph's hover cards. One query for the whole step."""
        step = self.step_row(trial_id, training_step, iteration, rank, type_of_execution)  # once: graph and type
        graph = self._trials.trial(trial_id).graph(step["graph"])
        type_of_execution = step["type_of_execution"]
        # also what the next clicks in this step read
        table = self._reads.step_rows(trial_id, training_step, rank, type_of_execution)
        # Filtered in Arrow first: at 1,000 nodes a step has thousands of rows, and Python rows cost.
        table = table.filter(pc.and_(pc.equal(table["kind"], kind),
                                     pc.is_in(table["aggregation"], pa.array(["mean", "none"])))).select(
            ["node", "role", "iteration", "aggregation", "min", "mean", "max"])
        wanted_rows: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
        for row in table.to_pylist():
            wanted_rows.setdefault((row["node"], row["role"], row["iteration"]), row)
        summaries: dict[str, dict[str, float | None]] = {}
        for node in graph["nodes"]:
            roles = node.get("roles") or []
            key = (node["node"], roles[0] if roles else None, node_data_iteration(node, iteration))
            row = wanted_rows.get(key)
            if row is not None:
                summaries[node["id"]] = {name: row[name] for name in ("min", "mean", "max")}
        return summaries

    def step_row(self, trial_id: str, training_step: int, iteration: int, rank: int = 0,
                 type_of_execution: str | None = None) -> dict[str, Any]:
        """The steps index's row of one (training step, iteration): type, graph hash, samples, categories. A number
        several types share: of ``type_of_execution`` (None: the main type's; see ``StepIndex.rows_of``)."""
        rows = [r for r in self._reads.step_index(trial_id, rank).rows_of(training_step, type_of_execution)
                if r["iteration"] == iteration]
        if not rows:
            raise SelectionError(f"Trial {trial_id!r} has no iteration {iteration} of training step {training_step} "
                                 f"(rank {rank}); choose a recorded step in the Tensors tab.")
        return rows[0]

    def graph_at(self, trial_id: str, training_step: int, iteration: int, rank: int = 0,
                 type_of_execution: str | None = None) -> fmt.GraphDocument:
        """The dependency graph of one iteration of one recorded step."""
        row = self.step_row(trial_id, training_step, iteration, rank, type_of_execution)
        return self._trials.trial(trial_id).graph(row["graph"])

    def adjacent_step(self, trial_id: str, type_of_execution: str, training_step: int, *, offset: int = 0,
                      index: int | None = None, rank: int | None = 0) -> int | None:
        """The number of ``adjacent_position``."""
        position = self.adjacent_position(trial_id, type_of_execution, training_step, offset=offset, index=index,
                                          rank=rank)
        return None if position is None else position[0]

    def adjacent_position(self, trial_id: str, type_of_execution: str, training_step: int, *, offset: int = 0,
                          index: int | None = None, rank: int | None = 0,
                          step_type: str | None = None) -> tuple[int, str] | None:
        """The recorded step (number, type) ``offset`` steps of this type away from (``training_step``,
        ``step_type``) (clamped to the first and last), or the ``index``-th one; None when the type has no steps.
        The step buttons and slider ask this; an evaluation that shares a training step's number is a step of its
        own (``StepIndex.positions``)."""
        positions = self._reads.step_index(trial_id, rank).positions(type_of_execution)
        if not positions:
            return None
        if index is None:
            steps = [step for step, _ in positions]
            here = next((i for i, pair in enumerate(positions) if pair == (training_step, step_type)), None)
            if here is None and training_step in steps:
                here = steps.index(training_step)
            if here is None:
                here = int(np.searchsorted(steps, training_step)) - (1 if offset > 0 else 0)
            index = here + offset
        step, kind = positions[max(0, min(len(positions) - 1, index))]
        return int(step), kind

    def neuron_values(self, selection: Selection) -> NeuronValues:
        """The stored values of the selected tensor (the first ones of the flattened value dimensions)."""
        row = self.selection_row(selection)
        if row is None:
            return NeuronValues([], [], 0)
        values = row["neurons"] or []
        return NeuronValues(values, list(row["shape"] or []), int(row["num_neurons"] or len(values)))

    def selection_row(self, selection: Selection) -> dict[str, Any] | None:
        """The stored row of a selection (statistics and neurons); None when it has no values.

        From the step's kept rows where the app keeps them (the shown step and its neighbours): a query
        of one row in a 50x chunk costs hundreds of milliseconds, and ran beside the user's next click."""
        aggregation, sample = parse_aggregation(selection.aggregation)
        index = self._reads.step_index(selection.trial, selection.rank)
        rows = self._reads.node_rows(selection.trial, index, selection.training_step, iteration=selection.data_iteration,
                                     node=selection.node, rank=selection.rank, type_of_execution=selection.step_type)
        wanted = {"kind": selection.kind, "role": selection.role, "aggregation": aggregation, "sample": sample}
        return next((row for row in rows if all(row[key] == value for key, value in wanted.items())), None)

    def compare(self, pinned: Selection, current: Selection) -> Comparison:
        """The statistics of two selections (another trial, step or node) and their difference, current - pinned."""
        first, second = self.selection_row(pinned), self.selection_row(current)
        deltas: dict[str, float | None] = {}
        for name in PLOT_STATISTICS:
            a, b = (first or {}).get(name), (second or {}).get(name)
            deltas[name] = None if a is None or b is None else float(b) - float(a)
        return Comparison(pinned, current, first, second, deltas)

    def counterpart(self, selection: Selection, *, trial: str | None = None, training_step: int | None = None) -> View:
        """The same tensor under the same lens in another trial and/or at another step: what Compare pins.

        Whatever does not exist there (the step, the iteration, the node) falls back as in
        ``resolve``, and the view's notices say what changed.
        """
        wanted = {"trial": trial or selection.trial, "type_of_execution": ANY_TYPE, "step_type": selection.step_type,
                  "training_step": selection.training_step if training_step is None else training_step,
                  "iteration": selection.iteration, "node_id": selection.node_id,
                  "roles": {selection.node: selection.role}, "kind": selection.kind,
                  "aggregation": selection.aggregation, "rank": selection.rank}
        return resolve(self._trials, self._reads, wanted)

    def sample_columns(self, trial_id: str, training_step: int, iteration: int, *, rank: int = 0,
                       type_of_execution: str | None = None) -> list[SampleColumn]:
        """Every (node, role, kind) of this iteration that has per-sample values: the samples table's choices."""
        step = self.step_row(trial_id, training_step, iteration, rank, type_of_execution)
        graph = self._trials.trial(trial_id).graph(step["graph"])
        table = self._reads.tensor_rows(trial_id, training_step, columns=["node", "role", "kind", "iteration"],
                                        aggregation="sample", rank=rank, type_of_execution=step["type_of_execution"])
        recorded = set(zip(*(table.column(c).to_pylist() for c in ("node", "role", "kind", "iteration"))))
        columns = []
        for node in sorted(graph["nodes"], key=lambda n: (n["column"], n["row"])):
            data_iteration = node_data_iteration(node, iteration)
            for node_name, role, kind, at in sorted(recorded, key=lambda r: (r[2] != fmt.FORWARD, r[2], r[1])):
                if node_name == node["node"] and at == data_iteration:
                    columns.append(SampleColumn(node["id"], role, kind))
        return columns

    def samples_table(self, trial_id: str, training_step: int, iteration: int, columns: list[SampleColumn], *,
                      rank: int = 0, type_of_execution: str | None = None) -> SamplesTable:
        """One row per recorded sample of one iteration, one value per column (a statistic or one neuron).

        The tutorial's last finding is one look at this table: sort by ``loss_per_sample``
        and read ``helper_partial_sums`` beside it.
        """
        step = self.step_row(trial_id, training_step, iteration, rank, type_of_execution)
        graph = self._trials.trial(trial_id).graph(step["graph"])
        nodes = {n["id"]: n for n in graph["nodes"]}
        samples = list(step["samples"] or [])
        categories = dict(zip(samples, step["categories"] or [None] * len(samples)))
        values: dict[str, dict[int, float | None]] = {}
        missing = []
        for column in columns:
            node = nodes.get(column.node_id)
            found = self._sample_values(trial_id, (training_step, step["type_of_execution"]),
                                        node_data_iteration(node, iteration), node["node"], column, rank) if node else {}
            if not found:
                missing.append(column.label)
            for sample in found:
                categories.setdefault(sample, None)
            values[column.key] = found
        rows = [{"sample": sample, "category": categories[sample], "type_of_execution": step["type_of_execution"],
                 **{key: by_sample.get(sample) for key, by_sample in values.items()}} for sample in sorted(categories)]
        return SamplesTable(trial_id, training_step, iteration, step["type_of_execution"], list(columns), rows, missing)

    def _sample_values(self, trial_id: str, step: tuple[int, str], data_iteration: int, node: str,
                       column: SampleColumn, rank: int) -> dict[int, float | None]:
        read = "neurons" if column.statistic == NEURON else column.statistic
        if read not in (*PLOT_STATISTICS, "neurons"):
            raise SelectionError(f"Unknown statistic {column.statistic!r} for the samples table"
                                 + did_you_mean(column.statistic, [*PLOT_STATISTICS, NEURON]))
        table = self._reads.tensor_rows(trial_id, step[0], columns=["sample", read], kind=column.kind,
                                        iteration=data_iteration, node=node, role=column.role, aggregation="sample",
                                        rank=rank, type_of_execution=step[1])
        found: dict[int, float | None] = {}
        for sample, value in zip(table.column("sample").to_pylist(), table.column(read).to_pylist()):
            if read == "neurons":
                value = value[column.neuron] if value is not None and 0 <= column.neuron < len(value) else None
            found[int(sample)] = None if value is None else float(value)
        return found


NEURON = "neuron"  # a samples-table column of one stored value instead of a statistic


@dataclass(frozen=True)
class SampleColumn:
    """One column of the samples table: a statistic (or one neuron) of one tensor, per sample."""

    node_id: str  # the node's id in the iteration's graph ("state*old" for an earlier iteration's)
    role: str
    kind: str = fmt.FORWARD
    statistic: str = "mean"  # one of service.PLOT_STATISTICS, or NEURON
    neuron: int = -1  # with NEURON: the index among the stored values

    @property
    def key(self) -> str:
        """A string that names the column (a table's column id, a dropdown's value); ``parse`` reads it back."""
        what = f"{NEURON}:{self.neuron}" if self.statistic == NEURON else self.statistic
        return "|".join((self.node_id, self.role, self.kind, what))

    @property
    def label(self) -> str:
        role = "" if self.role == self.node_id else f" [{self.role}]"
        kind = "" if self.kind == fmt.FORWARD else f" ({self.kind})"
        what = f"neuron {self.neuron}" if self.statistic == NEURON else self.statistic
        return f"{self.node_id}{role}{kind} · {what}"

    def with_statistic(self, statistic: str, neuron: int = -1) -> SampleColumn:
        return SampleColumn(self.node_id, self.role, self.kind, statistic, neuron if statistic == NEURON else -1)

    @staticmethod
    def parse(key: Any) -> SampleColumn | None:
        """The column a key names; None for anything else (a key comes from the browser)."""
        parts = key.split("|") if isinstance(key, str) else []
        if len(parts) != 4 or not all(parts[:3]):
            return None
        statistic, _, neuron = parts[3].partition(":")
        node_id, role, kind = parts[:3]
        if statistic == NEURON:
            valid = neuron.isdigit() and len(neuron) < 10
            return SampleColumn(node_id, role, kind, NEURON, int(neuron)) if valid else None
        valid = statistic in PLOT_STATISTICS and not neuron
        return SampleColumn(node_id, role, kind, statistic) if valid else None


@dataclass
class SamplesTable:
    trial: str
    training_step: int
    iteration: int
    type_of_execution: str
    columns: list[SampleColumn]
    rows: list[dict[str, Any]]  # {"sample", "category", "type_of_execution", column.key: value or None}
    missing: list[str]  # labels of the columns without per-sample values in this iteration


@dataclass(frozen=True)
class NeuronValues:
    values: list[float]  # the first stored values of the flattened value dimensions
    shape: list[int]  # the tensor's shape (with the batch dimension for a batch tensor)
    total: int  # how many values the tensor has; more than len(values) when the recorder kept the first ones


@dataclass(frozen=True)
class Comparison:
    pinned: Selection
    current: Selection
    pinned_row: dict[str, Any] | None
    current_row: dict[str, Any] | None
    deltas: dict[str, float | None]  # statistic -> current - pinned (None where either has no value)


def visualization_selection(selection: Selection) -> dict[str, Any]:
    """What a custom visualization's ``create_visualization`` gets as ``selection`` (see server/visualization.py)."""
    aggregation, sample = parse_aggregation(selection.aggregation)
    return {"trial": selection.trial, "training_step": selection.training_step,
            "type_of_execution": selection.step_type, "kind": selection.kind, "iteration": selection.iteration,
            "node": selection.node, "role": selection.role, "aggregation": aggregation, "sample": sample}
