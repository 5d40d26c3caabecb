"""KPI points, buffered so that tensors reach the host in one transfer per flush, not one sync per call."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import time

import pyarrow as pa
import torch

from comgra.errors import RecordingError
from comgra.store import format as fmt


KPI_ROWS = pa.schema([*fmt.KPIS_SCHEMA, *fmt.ADDED_COLUMNS["kpis"]])


@dataclass
class KpiBuffer:
    rows: list[tuple[str, str, str | None, int, Any, float]] = field(default_factory=list)
    step_start: int = 0  # the points before this index came before the open step (abandon_step keeps only those)

    def add(self, group: str, name: str, type_of_execution: str | None, timepoint: int, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise RecordingError(f"record_kpi_in_graph({group!r}, {name!r}, ...) got a tensor of shape "
                                     f"{tuple(value.shape)}; pass a number or a one-element tensor, e.g. loss.mean().")
            value = value.detach().reshape(())
        elif not isinstance(value, (int, float)):
            raise RecordingError(f"record_kpi_in_graph({group!r}, {name!r}, val={value!r}): val must be a number "
                                 "or a one-element tensor.")
        self.rows.append((str(group), str(name), type_of_execution, int(timepoint), value, time.time()))

    def set_type(self, type_of_execution: str | None) -> None:
        """Dynamic recordings learn their type at the end of the step: fill it in for its points.

        A step decided as None gets "" at once, so that a later step's type cannot claim its points.
        """
        decided = type_of_execution or ""
        self.rows = [(g, n, decided if t is None else t, p, v, w) for g, n, t, p, v, w in self.rows]

    def start_step(self) -> None:
        self.step_start = len(self.rows)

    def drop_step(self) -> None:
        """Forget the points given since the open step started (those a flush took meanwhile are written)."""
        del self.rows[self.step_start:]

    def take(self) -> pa.Table | None:
        self.step_start = 0
        if not self.rows:
            return None
        rows, self.rows = self.rows, []
        tensors = [r[4] for r in rows if isinstance(r[4], torch.Tensor)]
        host = iter(torch.stack([t.float() for t in tensors]).cpu().tolist()) if tensors else iter(())
        values = [next(host) if isinstance(r[4], torch.Tensor) else float(r[4]) for r in rows]
        return pa.table({
            "kpi_group": [r[0] for r in rows], "kpi_name": [r[1] for r in rows],
            "type_of_execution": [r[2] or "" for r in rows], "timepoint": [r[3] for r in rows], "value": values,
            "wall_time": [r[5] for r in rows],  # when record_kpi_in_graph was called: the wall-time x-axes
        }, schema=KPI_ROWS)
