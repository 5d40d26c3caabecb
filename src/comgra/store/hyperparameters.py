"""A trial's hyperparameters: one JSON document beside trial.json and one small Parquet table for engines.

    GROUP/trials/<trial id>/hyperparameters.json                   {"name": value, ...} (the typed values)
    GROUP/hyperparameters/trial=<escaped id>/rank=0/hyperparameters.parquet   name, value (text), number

The document is what comgra reads (it is moved aside with its trial when a run takes the trial id
again); the table is the same values in the group's Hive layout (``store.layout``), so that DuckDB,
Spark or Ray join hyperparameters to KPIs and findings over thousands of trials in one query:

    SELECT trial, name, number FROM read_parquet('GROUP/hyperparameters/**/*.parquet', hive_partitioning=true)

Values are numbers, strings, booleans or None; nested mappings are flattened with dots
(``{"optimizer": {"lr": 0.1}}`` -> ``optimizer.lr``). ``number`` is the value as a float where it is a
number or a boolean (1.0/0.0), else null; ``value`` is its text (``str`` for strings, JSON otherwise).
"""
from __future__ import annotations

import enum
import json
import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from comgra.errors import RecordingError, StoreError
from comgra.store import format as fmt
from comgra.store import layout

DOCUMENT = "hyperparameters.json"
TABLE = "hyperparameters"
TABLE_FILE = "hyperparameters.parquet"
SCHEMA = pa.schema([("name", pa.string()), ("value", pa.string()), ("number", pa.float64())])
Scalar = bool | int | float | str | None


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """``mapping`` as ``{dotted name: scalar}``; a value of another type is a RecordingError naming its key.

    >>> flatten({"lr": 0.1, "optimizer": {"name": "adam", "betas": {"b1": 0.9}}})
    {'lr': 0.1, 'optimizer.name': 'adam', 'optimizer.betas.b1': 0.9}
    """
    if not isinstance(mapping, Mapping):
        raise RecordingError(f"record_hyperparameters takes a mapping of names to values, not "
                             f"{type(mapping).__name__} {_short(mapping)}; e.g. record_hyperparameters({{'lr': 0.1}}).")
    flat: dict[str, Scalar] = {}
    for key, value in mapping.items():
        if not isinstance(key, str) or not key:
            raise RecordingError(f"Hyperparameter name {key!r}{' in ' + repr(prefix[:-1]) if prefix else ''} is not a "
                                 "non-empty string; use names such as 'lr' or 'optimizer.momentum'.")
        name = prefix + key
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = scalar(name, value)
    return flat


def scalar(name: str, value: Any) -> Scalar:
    """A hyperparameter's value as a plain Python scalar (numpy scalars too), or a RecordingError naming ``name``."""
    if isinstance(value, enum.Enum):  # transformers' SchedulerType, IntervalStrategy, ...
        return scalar(name, value.value)
    if value is None or isinstance(value, (bool, str)):
        return value if type(value) in (bool, str) or value is None else (bool(value) if isinstance(value, bool)
                                                                           else str(value))
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)  # a numpy or 0-d array scalar
    if callable(item) and getattr(value, "ndim", None) == 0:
        return scalar(name, item())
    raise RecordingError(f"Hyperparameter {name!r} is {type(value).__name__} {_short(value)}; comgra keeps numbers, "
                         f"strings, booleans and None. Pass a plain value, e.g. {{{name!r}: str(value)}}, or leave "
                         "it out.")


def scalars_of(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """What the Trainer and Lightning callbacks record of a configuration they did not write: ``flatten``'s
    values, lists and tuples of scalars as their JSON text, and anything else left out (never an error)."""
    flat: dict[str, Scalar] = {}
    for key, value in mapping.items():
        name = prefix + str(key)
        if isinstance(value, Mapping):
            flat.update(scalars_of(value, name + "."))
            continue
        try:
            flat[name] = scalar(name, value)
        except RecordingError:
            if isinstance(value, (list, tuple)) and len(value) <= 64:
                try:
                    flat[name] = json.dumps([scalar(name, v) for v in value])
                except (RecordingError, ValueError):
                    continue
    return flat


def table_of(values: Mapping[str, Scalar]) -> pa.Table:
    """The rows of the Parquet table: name, value (text), number."""
    names = sorted(values)
    return pa.table({"name": names, "value": [text_of(values[n]) for n in names],
                     "number": [number_of(values[n]) for n in names]}, schema=SCHEMA)


def text_of(value: Scalar) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def number_of(value: Scalar) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def write(group_dir: Path, trial_id: str, values: Mapping[str, Scalar]) -> None:
    """Write both forms, each atomically (a reader sees the old or the new values, never half)."""
    document = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in values.items()}
    fmt.write_json_atomic(fmt.trial_dir(group_dir, trial_id) / DOCUMENT, document)
    folder = layout.partition_dir(group_dir, TABLE, trial_id, 0)
    folder.mkdir(parents=True, exist_ok=True)
    fmt.write_parquet_atomic(folder / TABLE_FILE, table_of(values))


def read(trial_directory: Path) -> dict[str, Scalar]:
    """A trial's hyperparameters ({} where none were recorded); a damaged document is a StoreError."""
    path = trial_directory / DOCUMENT
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise StoreError(f"Cannot read {str(path)!r}: {error}.") from None
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise StoreError(f"{str(path)!r} is not a JSON object of hyperparameters; record them again or delete it.")
    return {str(k): v if v is None or isinstance(v, (bool, int, float, str)) else str(v) for k, v in document.items()}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
