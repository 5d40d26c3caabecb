"""Long KPI series cut to what a plot can show, keeping every bucket's extremes (min/max downsampling).

A 20,000-step run logs 20,000 points per curve; a plot 1,000 pixels wide shows at most a few thousand, and
JSON for all of them took about a second per request (``GET /trials/<t>/kpis``). Each curve is split into
``max_points / 2`` buckets of consecutive points; of each bucket the lowest and the highest point are kept
(and the first non-finite one), so a spike or a NaN is never smoothed away. The full series stays one
request away (``max_points=0``) and in the Graphs tab's CSV export.

    >>> import numpy as np
    >>> extreme_indices(np.array([0.0, 5.0, 1.0, 2.0, -3.0, 1.0]), 4).tolist()
    [0, 1, 4, 5]
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_POINTS = 2000
CURVE_KEYS = ("kpi_group", "kpi_name", "type_of_execution", "rank")


def extreme_indices(values: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Sorted indices of at most about ``max_points`` points of ``values``: each bucket's extremes."""
    n = len(values)
    if max_points <= 0 or n <= max_points:
        return np.arange(n)
    buckets = max(1, max_points // 2)
    size = -(-n // buckets)
    padded = np.full(buckets * size, np.nan)
    padded[:n] = values
    grid = padded.reshape(buckets, size)
    finite = np.isfinite(grid)
    offsets = np.arange(buckets) * size
    keep = [offsets + np.where(finite, grid, np.inf).argmin(1), offsets + np.where(finite, grid, -np.inf).argmax(1)]
    bad = ~finite & (np.arange(buckets * size).reshape(buckets, size) < n)
    keep.append((offsets + bad.argmax(1))[bad.any(1)])
    index = np.unique(np.concatenate(keep))
    return index[index < n]


def downsampled(table: pa.Table, max_points: int = MAX_POINTS) -> tuple[pa.Table, bool]:
    """``table`` (KPI rows) with each curve cut to ``max_points`` (0: all), in timepoint order; and whether any
    curve was cut."""
    if max_points <= 0 or table.num_rows <= max_points:
        return table, False
    keys = [k for k in CURVE_KEYS if k in table.column_names]
    table = table.sort_by([(k, "ascending") for k in keys] + [("timepoint", "ascending")])
    codes = np.zeros(table.num_rows, dtype=np.int64)
    for key in keys:
        encoded = pc.dictionary_encode(table[key].cast(pa.string()) if key == "rank" else table[key]).combine_chunks()
        codes = codes * (len(encoded.dictionary) + 1) + encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False) + 1
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    ends = np.r_[starts[1:], len(codes)]
    values = table["value"].to_numpy(zero_copy_only=False).astype(float)
    kept = [start + extreme_indices(values[start:end], max_points) for start, end in zip(starts, ends)]
    index = np.concatenate(kept)
    return table.take(pa.array(index)), len(index) < table.num_rows
