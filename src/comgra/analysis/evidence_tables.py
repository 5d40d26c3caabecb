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


def phases(data: TrialData) -> dict[tuple[int, int], str]:
    """(rank, training_step) -> "training" or "evaluation" for every recorded step with run information: an
    evaluation step ran without gradients, or its type of execution says so by name."""
    if "phases" in data.tables:
        return dict(data.tables["phases"])
    found: dict[tuple[int, int], str] = {}
    steps = runinfo_field(data, "step", "batch_size")
    grad = runinfo_field(data, "step", "grad_enabled")
    no_grad = {(int(r), int(s)) for r, s, v in zip(grad.get("rank", []), grad.get("training_step", []),
                                                   grad.get("value", [])) if v == "False"}
    for rank, step, kind in zip(steps.get("rank", []), steps.get("training_step", []),
                                steps.get("type_of_execution", [])):
        key = (int(rank), int(step))
        evaluation = key in no_grad or (isinstance(kind, str) and EVALUATION_NAME.search(kind) is not None)
        found[key] = EVALUATION if evaluation else TRAINING
    data.tables["phases"] = found
    return found


def with_phase(data: TrialData, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (with rank and training_step) with a ``phase`` column; rows of steps without one are left out."""
    known = phases(data)
    if not len(frame):
        return frame.assign(phase=pd.Series(dtype=object))
    phase = [known.get((int(r), int(s))) for r, s in zip(frame["rank"], frame["training_step"])]
    return frame.assign(phase=phase)[[p is not None for p in phase]]


def parameter_nodes(data: TrialData) -> dict[str, str]:
    """Parameter name -> the node it is shown in (a prefix option may group several parameters in one node)."""
    stats = data.stats
    if not len(stats) or "tensor_type" not in stats:
        return {}
    rows = stats[stats["tensor_type"] == "parameter"]
    return dict(zip(rows["role"].astype(str), rows["node"].astype(str)))
