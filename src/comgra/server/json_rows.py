"""A table's rows as JSON a slice at a time: an answer that grows with the run (the step index) without a Python
object per row of the whole table at once (issue 31 item 13, round six).

``table.to_pylist()`` of a live run's 2,400 recorded steps made 2,400 dicts of 11 items and their values, copied
again by ``api.plain``: 6.8 MiB of Python objects for a 0.54 MiB answer, on every ``GET .../steps``, and more each
minute the run wrote. Twenty clients asking at once left that peak in the allocators' pages. Here at most
``ROWS_PER_SLICE`` rows are Python objects at a time; the text is the same as ``json.dumps`` of the whole list
(Flask's provider, sorted keys, compact separators, each value through ``api.plain``).

    >>> import pyarrow as pa
    >>> from flask import Flask
    >>> with Flask("doc").app_context():
    ...     rows_json(pa.table({"b": [1, 2], "a": [0.5, None]}), plain=lambda v: v, rows_per_slice=1)
    '[{"a":0.5,"b":1},{"a":null,"b":2}]'
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
from flask import current_app, json

ROWS_PER_SLICE = 256


def rows_json(table: pa.Table, *, plain: Callable[[Any], Any], rows_per_slice: int = ROWS_PER_SLICE) -> Encoded:
    """``json.dumps(plain(table.to_pylist()))`` in compact form, built ``rows_per_slice`` rows at a time."""
    parts = []
    for first in range(0, table.num_rows, rows_per_slice):
        text = json.dumps(plain(table.slice(first, rows_per_slice).to_pylist()), separators=(",", ":"))
        parts.append(text[1:-1])  # the slice's rows without its brackets
    return Encoded("[" + ",".join(p for p in parts if p) + "]")


class Encoded(str):
    """JSON text already (``rows_json``), put into ``object_json``'s object as it is."""


def object_json(fields: dict[str, Any], *, plain: Callable[[Any], Any]) -> str:
    """``json.dumps(plain(fields))`` in compact form, where a value that is ``Encoded`` goes in as it is; keys in
    the order Flask's provider gives them (sorted, unless the app turned that off)."""
    items = {k: v if isinstance(v, Encoded) else json.dumps(plain(v), separators=(",", ":")) for k, v in fields.items()}
    order = sorted(items) if getattr(current_app.json, "sort_keys", True) else list(items)
    return "{" + ",".join(f"{json.dumps(k)}:{items[k]}" for k in order) + "}"
