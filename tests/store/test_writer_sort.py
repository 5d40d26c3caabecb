"""The writer's fast sort of a tensors chunk gives exactly the order of ``Table.sort_by(format.TENSOR_SORT)``."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from comgra.store import format as fmt
from comgra.store.writer import _sorted, _tensor_order

NAMES = st.sampled_from(["", "a", "B", "b", "node_10", "node_9", "ü", "日本", "a b", "\x00z"])
ROWS = st.lists(st.fixed_dictionaries({
    "training_step": st.integers(0, 2**40), "kind": NAMES, "iteration": st.integers(-1, 3), "node": NAMES,
    "role": NAMES, "aggregation": st.sampled_from(fmt.AGGREGATIONS), "sample": st.integers(-1, 5),
    "mean": st.integers(0, 1000).map(float)}), max_size=60)


def _table(rows: list[dict]) -> pa.Table:
    schema = fmt.SCHEMAS["tensors"]
    full = [{**{name: None for name in schema.names}, "rank": 0, **row} for row in rows]
    return pa.Table.from_pylist(full, schema=schema)


@settings(max_examples=200, deadline=None)
@given(ROWS)
def test_the_fast_order_is_arrows_order(rows: list[dict]) -> None:
    table = _table(rows + rows[: len(rows) // 3])  # some rows twice: a stable sort keeps their order
    table = table.append_column("position", pa.array(range(table.num_rows)))  # tells equal rows apart
    assert _tensor_order(table.drop_columns(["position"])) is not None
    assert _sorted("tensors", table).to_pylist() == table.sort_by(fmt.TENSOR_SORT).to_pylist()


def test_a_table_it_cannot_key_falls_back_to_arrows_sort() -> None:
    rows = [{"training_step": 1, "kind": "forward", "iteration": 0, "node": None, "role": "r", "aggregation": "none",
             "sample": -1}, {"training_step": 0, "kind": "forward", "iteration": 0, "node": "a", "role": "r",
                             "aggregation": "none", "sample": 5}]
    table = _table(rows)
    assert _tensor_order(table) is None  # a null key
    assert _sorted("tensors", table).to_pylist() == table.sort_by(fmt.TENSOR_SORT).to_pylist()
    huge = _table([{**rows[1], "iteration": -2**31}, {**rows[1], "iteration": 2**31 - 1, "sample": -2**31},
                   {**rows[1], "node": "b", "sample": 2**31 - 1}])
    assert _tensor_order(huge) is None  # the keys' product does not fit 62 bits
    assert _sorted("tensors", huge).to_pylist() == huge.sort_by(fmt.TENSOR_SORT).to_pylist()
