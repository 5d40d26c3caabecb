"""The KPI summaries of many trials (last, best, min, max of each KPI; the last timepoint) in one engine query.

The Runs view's first answer over a sweep needs a summary of every trial's KPIs. Reading them trial by trial
(a reader, a Parquet read and a sort per trial) cost about 1.5 CPU-s at 1,000 trials; here the listed KPI
chunks of every trial are one ``pyarrow.dataset`` (each file tagged with its trial and rank, so ids need no
escaping), scanned on Arrow's threads with the page checksums checked, and summarised by one grouped
aggregation. What this cannot read (a damaged or foreign chunk, a column of another type, a null where
a value is required) answers None, and the caller reads those trials one by one, as before, where the reader
reports the damage.

    >>> kpi_summaries({"trial_a": [Path("GROUP/kpis/trial=trial_a/rank=0/000-049-r000-000000.parquet")]})  # doctest: +SKIP
    {'trial_a': Summary(kpis={'loss/train': {'last': 0.1, 'best': 0.1, 'min': 0.1, 'max': 1.2}}, last_timepoint=49)}
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from comgra.store import format as fmt
from comgra.store import layout

HIGHER_IS_BETTER = re.compile(r"acc|f1|auc|precision|recall|score|reward|bleu|rouge|iou|map|r2|return", re.I)
_COLUMNS = ("kpi_group", "kpi_name", "timepoint", "value")
_KEYS = ["trial", "kpi_group", "kpi_name"]


@dataclass(frozen=True)
class Summary:
    kpis: dict[str, dict[str, float | None]]  # "group/name" -> last, best, min, max (of the finite points)
    last_timepoint: int | None  # the highest timepoint of any KPI point (None: no points)


def kpi_summaries(files: Mapping[str, list[Path]]) -> dict[str, Summary] | None:
    """The summary of each trial of ``files`` (trial id -> its format-3 KPI chunks, as the reader lists them);
    None if one of the chunks cannot be read as a KPI chunk (read those trials one by one)."""
    paths: list[str] = []
    partitions: list[ds.Expression] = []
    for trial, listed in files.items():
        for path in listed:
            paths.append(str(path))
            partitions.append((ds.field("trial") == trial) & (ds.field("rank") == layout.rank_of_chunk(path)))
    found = {trial: Summary({}, None) for trial in files}
    if not paths:
        return found
    schema = pa.schema([fmt.FILE_SCHEMAS["kpis"].field(name) for name in _COLUMNS]
                       + [pa.field("trial", pa.string()), pa.field("rank", pa.int64())])
    file_format = ds.ParquetFileFormat(
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True))
    try:
        dataset = ds.FileSystemDataset.from_paths(paths, schema=schema, format=file_format,
                                                  filesystem=pafs.LocalFileSystem(), partitions=partitions)
        table = dataset.to_table()
    except (OSError, pa.ArrowException, ValueError):
        return None
    if any(table[column].null_count for column in ("kpi_group", "kpi_name", "timepoint")):
        return None  # a chunk without a required column (the reader reports it as damaged)
    return {**found, **summaries_of(table)}


def summaries_of(table: pa.Table) -> dict[str, Summary]:
    """Per trial of ``table`` (columns trial, rank, kpi_group, kpi_name, timepoint, value): the summary of each KPI
    over its finite points in timepoint order (ties by rank), as ``service.runs.kpi_summary`` gives for one."""
    latest = table.group_by("trial").aggregate([("timepoint", "max")])
    found = {trial: Summary({}, int(step)) for trial, step in zip(latest["trial"].to_pylist(),
                                                                 latest["timepoint_max"].to_pylist())}
    # Every KPI a trial has, also one whose points are all NaN (its statistics are None then).
    keys = table.group_by(_KEYS).aggregate([])
    for trial, group, name in zip(*(keys[k].to_pylist() for k in _KEYS)):
        found[trial].kpis[f"{group}/{name}"] = dict.fromkeys(("last", "best", "min", "max"))
    values = table["value"].to_numpy(zero_copy_only=False)
    finite = table.filter(pa.array(np.isfinite(values.astype(float)))).sort_by(
        [("timepoint", "ascending"), ("rank", "ascending")])
    # Single-threaded, so that "last" is the last in timepoint order.
    statistics = finite.group_by(_KEYS, use_threads=False).aggregate(
        [("value", "min"), ("value", "max"), ("value", "last")])
    columns = [statistics[c].to_pylist() for c in (*_KEYS, "value_min", "value_max", "value_last")]
    for trial, group, name, low, high, last in zip(*columns):
        key = f"{group}/{name}"
        found[trial].kpis[key] = {"last": float(last), "best": float(high if HIGHER_IS_BETTER.search(key) else low),
                                  "min": float(low), "max": float(high)}
    return {trial: Summary(dict(sorted(summary.kpis.items())), summary.last_timepoint)
            for trial, summary in found.items()}


__all__ = ["HIGHER_IS_BETTER", "Summary", "kpi_summaries", "summaries_of"]
