"""The run's evidence beside its tensors, as the detectors read it: the ``runinfo`` table (module modes,
dtypes, optimizer groups, fingerprints; recorded steps), the ``sentinels`` table (every step) and which
steps were training and which evaluation. Read once per scan of a trial and kept on its ``TrialData``.
"""
from __future__ import annotations

import re
from typing import Any

import pandas as pd

from comgra.analysis.loading import TrialData, plain_labels

# A type of execution whose name says it is no training (the user's names: "validation", "eval_set", ...).
EVALUATION_NAME = re.compile(r"eval|valid|test|infer|predict", re.IGNORECASE)
TRAINING, EVALUATION = "training", "evaluation"


def table(data: TrialData, name: str) -> pd.DataFrame:
    """``runinfo``, ``sentinels`` or ``layers`` of the trial as a DataFrame (empty where the recording has none)."""
    if name not in data.tables:
        data.tables[name] = _read(data.reader, name)
    frame: pd.DataFrame = data.tables[name]
    return frame


def _read(reader: Any, name: str) -> pd.DataFrame:
    if reader is None:
        return pd.DataFrame()
    try:
        arrow = reader.layers() if name == "layers" else reader.evidence(name)
    except AttributeError:  # a reader of a recording made before these tables (or a stand-in without them)
        return pd.DataFrame()
    return plain_labels(arrow.to_pandas())  # the detectors filter these tables dozens of times per trial


def runinfo_field(data: TrialData, subject: str, field: str) -> pd.DataFrame:
    """The rows of one subject's field: columns rank, training_step, type_of_execution, name, value, number."""
    info = table(data, "runinfo")
    if not len(info):
        return info
    fields = data.tables.get("runinfo_fields")
    if fields is None:  # split once per trial: the detectors ask for about twenty fields
        fields = {(str(s), str(f)): rows for (s, f), rows in info.groupby(["subject", "field"], sort=False,
                                                                           observed=True)}
        data.tables["runinfo_fields"] = fields
    found = fields.get((subject, field))
    return info.iloc[:0] if found is None else found.copy(deep=False)  # a frame of its own, as a filter gave


def phases(data: TrialData) -> dict[tuple[Any, ...], str]:
    """(rank, training_step, type_of_execution) -> "training" or "evaluation" for every recorded step with run
    information: an evaluation step ran without gradients, or its type of execution says so by name. A step is
    its number and its type (an evaluation may share a training step's number: the Trainer's global_step);
    (rank, training_step) holds a number's phase where all its steps have one."""
    if "phases" in data.tables:
        return dict(data.tables["phases"])
    found: dict[tuple[Any, ...], str] = {}
    steps = runinfo_field(data, "step", "batch_size")
    grad = runinfo_field(data, "step", "grad_enabled")
    no_grad = {key(r, s, k) for r, s, k, v in zip(grad.get("rank", []), grad.get("training_step", []),
                                                  grad.get("type_of_execution", []), grad.get("value", [])) if v == "False"}
    by_number: dict[tuple[int, int], set[str]] = {}
    for rank, step, kind in zip(steps.get("rank", []), steps.get("training_step", []),
                                steps.get("type_of_execution", [])):
        evaluation = key(rank, step, kind) in no_grad or (isinstance(kind, str) and EVALUATION_NAME.search(kind) is not None)
        found[key(rank, step, kind)] = phase = EVALUATION if evaluation else TRAINING
        by_number.setdefault((int(rank), int(step)), set()).add(phase)
    found.update({number: next(iter(both)) for number, both in by_number.items() if len(both) == 1})
    data.tables["phases"] = found
    return found


def key(rank: Any, step: Any, kind: Any) -> tuple[int, int, str | None]:
    """A step's key in ``phases``."""
    return int(rank), int(step), kind if isinstance(kind, str) else None


def phase_of(known: dict[tuple[Any, ...], str], frame: pd.DataFrame) -> list[str | None]:
    """The phase of each row of ``frame`` (rank, training_step and, where it has one, type_of_execution)."""
    if "type_of_execution" in frame.columns:
        return [known.get(key(r, s, k), known.get((int(r), int(s)))) for r, s, k in
                zip(frame["rank"], frame["training_step"], frame["type_of_execution"])]
    return [known.get((int(r), int(s))) for r, s in zip(frame["rank"], frame["training_step"])]


def with_phase(data: TrialData, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (with rank and training_step) with a ``phase`` column; rows of steps without one are left out."""
    known = phases(data)
    if not len(frame):
        return frame.assign(phase=pd.Series(dtype=object))
    phase = phase_of(known, frame)
    return frame.assign(phase=phase)[[p is not None for p in phase]]


def parameter_nodes(data: TrialData) -> dict[str, str]:
    """Parameter name -> the node it is shown in (a prefix option may group several parameters in one node)."""
    stats = data.stats
    if not len(stats) or "tensor_type" not in stats:
        return {}
    rows = stats[stats["tensor_type"] == "parameter"]
    return dict(zip(rows["role"].astype(str), rows["node"].astype(str)))
