"""The live layer's questions, answered as plain data: per-layer profiling (the layers table, its history,
the profile summary, flame graph and Chrome trace) and resource samples. No torch, no Dash.

    >>> LiveQuestions(trials).profile_summary("trial_a", "forward")  # doctest: +SKIP
"""
from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from comgra.analysis import profile as profile_analysis
from comgra.errors import SelectionError, did_you_mean
from comgra.service.trials import TrialQuestions
from comgra.store import validation

RESOURCES_DOCUMENT_GLOB = "resources-r*.json"
DEFAULT_HISTORY = 100


class LiveQuestions:
    """Profiling and resources of the trials of one group, read through its ``TrialQuestions``."""

    def __init__(self, trials: TrialQuestions):
        self._trials = trials

    # -- per-layer profiling ------------------------------------------------------------------
    def layer_table(self, trial_id: str, *, rank: int | None = None) -> pa.Table:
        """The ``layers`` table of a trial (every profiled execution), sorted by step, module, call."""
        return self._trials.trial(trial_id).layers(rank)

    def layer_rows(self, trial_id: str, *, rank: int | None = None, first_step: int | None = None,
                   last_step: int | None = None, execution: str | None = None) -> list[dict[str, Any]]:
        """The rows of the steps from ``first_step`` to ``last_step`` (None: no bound) of type ``execution``
        (None: every type; rows written before layers carried the type match any)."""
        table = self.layer_table(trial_id, rank=rank)
        if first_step is not None:
            table = table.filter(pc.greater_equal(table["training_step"], first_step))
        if last_step is not None:
            table = table.filter(pc.less_equal(table["training_step"], last_step))
        if execution is not None and "type_of_execution" in table.column_names:
            kinds = table["type_of_execution"]
            table = table.filter(pc.or_kleene(pc.is_null(kinds), pc.equal(kinds, execution)))
        return table.to_pylist()

    def layer_types(self, trial_id: str) -> list[str]:
        """The types of execution (training, evaluation, ...) of the profiled steps, the most profiled first."""
        table = self.layer_table(trial_id)
        if "type_of_execution" not in table.column_names or not table.num_rows:
            return []
        counts = pc.value_counts(table["type_of_execution"].drop_null()).to_pylist()
        return [c["values"] for c in sorted(counts, key=lambda c: (-c["counts"], c["values"]))]

    def layers(self, trial_id: str) -> list[dict[str, Any]]:
        """Each profiled module once: its name, parent, executions and forward time summary."""
        rows = self.layer_rows(trial_id)
        summary = {s.module: s for s in profile_analysis.layer_summary(rows)}
        modules = sorted({str(r["module"]) for r in rows})
        known = set(modules)
        result = []
        for module in modules:
            entry = summary.get(module)
            result.append({"module": module, "parent": profile_analysis.parent_of(module, known),
                           "calls": entry.calls if entry else 0, "forward_total": entry.total if entry else 0.0})
        return result

    def layer_history(self, trial_id: str, module: str, *, limit: int = DEFAULT_HISTORY) -> list[dict[str, Any]]:
        """The last ``limit`` executions of one module, oldest first."""
        table = self.layer_table(trial_id)
        rows = table.filter(pc.equal(table["module"], module)).to_pylist() if table.num_rows else []
        if not rows:
            known = sorted(set(table["module"].to_pylist())) if table.num_rows else []
            raise SelectionError(f"No profiled module {module!r} in trial {trial_id!r}"
                                 + (did_you_mean(module, known) if known else
                                    "; no module was profiled (track_module(name, module, profile=True))."))
        return rows[-limit:] if limit > 0 else []

    def profile_summary(self, trial_id: str, phase: str = "forward", *, limit: int | None = None,
                        first_step: int | None = None, last_step: int | None = None,
                        execution: str | None = None) -> list[dict[str, Any]]:
        rows = self.layer_rows(trial_id, first_step=first_step, last_step=last_step, execution=execution)
        return [s.to_dict() for s in profile_analysis.layer_summary(rows, phase, limit=limit)]

    def flame_graph(self, trial_id: str, phase: str = "forward", *, first_step: int | None = None,
                    last_step: int | None = None, execution: str | None = None) -> list[dict[str, Any]]:
        rows = self.layer_rows(trial_id, first_step=first_step, last_step=last_step, execution=execution)
        return [n.to_dict() for n in profile_analysis.flame_graph(rows, phase)]

    def chrome_trace(self, trial_id: str, *, first_step: int | None = None,
                     last_step: int | None = None, execution: str | None = None) -> dict[str, Any]:
        rows = self.layer_rows(trial_id, first_step=first_step, last_step=last_step, execution=execution)
        return profile_analysis.chrome_trace(rows, trial=trial_id)

    # -- resources -------------------------------------------------------------------------------
    def resource_status(self, trial_id: str) -> list[dict[str, Any]]:
        """What each rank's sampler said about its machine (e.g. ``gpu_status``: "no GPU: ...")."""
        trial = self._trials.trial(trial_id)
        result = []
        for path in sorted(trial.directory.glob(RESOURCES_DOCUMENT_GLOB)):
            if not validation.inside(path, trial.directory):
                continue
            try:
                document = json.loads(validation.read_regular_file(path))  # a FIFO is refused, never waited on
            except RecursionError:
                trial.report_problem(path, "damaged: nested too deeply to be a resources document; left out")
                continue  # the samples still speak for themselves
            except (OSError, ValueError) as error:
                trial.report_problem(path, f"damaged: not a readable JSON document ({str(error)[:80]}); left out")
                continue
            if not isinstance(document, dict):
                trial.report_problem(path, f"damaged: a JSON {type(document).__name__}, not an object; left out")
            else:
                rank = path.stem.rsplit("-r", 1)[-1]
                result.append({"rank": int(rank) if rank.isdigit() else 0, **document})
        return result

    def resource_series(self, trial_id: str) -> list[dict[str, Any]]:
        """One entry per (rank, source, metric): arrays of wall_time, training_step and value."""
        table = self._trials.trial(trial_id).resources()
        series: dict[tuple[int, str, str], dict[str, Any]] = {}
        columns = [table[c].to_pylist() for c in ("rank", "source", "metric", "wall_time", "training_step", "value")]
        for rank, source, metric, wall_time, step, value in zip(*columns):
            entry = series.setdefault((rank, source, metric), {"rank": rank, "source": source, "metric": metric,
                                                               "wall_time": [], "training_step": [], "value": []})
            entry["wall_time"].append(wall_time)
            entry["training_step"].append(step)
            entry["value"].append(value)
        return [series[key] for key in sorted(series)]

    def resources(self, trial_id: str) -> dict[str, Any]:
        status = self.resource_status(trial_id)
        gpu = [s["gpu_status"] for s in status if isinstance(s.get("gpu_status"), str) and s["gpu_status"]]
        return {"status": status, "gpu": gpu[0] if gpu else "unknown: no resource samples were recorded",
                "series": self.resource_series(trial_id)}
