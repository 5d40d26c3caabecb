"""The service's data questions beyond ``resolve``: samples table, neurons, step navigation, a type named "any".

Every answer is checked against the store's rows read independently (pyarrow over the chunk files).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from comgra.service import ANY_TYPE, NEURON, RecordingService, SampleColumn, parse_aggregation
from comgra.store import layout

BUGGED = "trial_bugged_original_version"
FIXED = "trial_no_activation_function_on_output_layer"


@pytest.fixture(scope="module")
def service(recording: Path) -> RecordingService:
    return RecordingService(recording)


def store_rows(recording: Path, trial: str, **equal: object) -> list[dict]:
    """The tensors table's rows that match ``equal``, read with pyarrow's dataset API (not comgra's reader)."""
    dataset = ds.dataset(str(layout.trial_partition(recording, "tensors", trial)), format="parquet", partitioning="hive")
    condition = None
    for key, value in equal.items():
        term = pc.field(key) == value
        condition = term if condition is None else condition & term
    return dataset.to_table(filter=condition).to_pylist()


def steps_rows(recording: Path, trial: str) -> list[dict]:
    return ds.dataset(str(layout.trial_partition(recording, "steps", trial)), format="parquet", partitioning="hive").to_table().to_pylist()


# -- a type of training step named "any" ------------------------------------------------------------------
def test_a_type_of_step_named_any_is_a_type_not_the_all_types_filter(make_recorder, record_step, model_forward,
                                                                    tiny_model, generator, store_root):
    torch = pytest.importorskip("torch")
    types = {0: "other", 1: "any", 2: "other", 3: "any"}
    recorder = make_recorder(steps=set(types))
    recorder.track_module("model", tiny_model)
    for step, type_ in types.items():
        x = torch.randn(4, 3, generator=generator)
        record_step(recorder, step, 4, model_forward(tiny_model, x), type_of_execution=type_)
    recorder.finalize()
    service = RecordingService(store_root / "group")
    view = service.resolve({})
    assert view.choices.types == [ANY_TYPE, "any", "other"]  # the filter and the user's type are two choices
    assert view.choices.steps == [0, 1, 2, 3]
    only_any = service.resolve({"type_of_execution": "any"})
    assert only_any.notices == []
    assert only_any.selection.type_of_execution == "any" and only_any.choices.steps == [1, 3]
    assert service.resolve({"type_of_execution": "any", "training_step": 2}).selection.training_step in (1, 3)
    assert service.step_index("trial").steps_of("any").tolist() == [1, 3]
    assert service.step_index("trial").steps_of(ANY_TYPE).tolist() == [0, 1, 2, 3]


# -- the samples table ----------------------------------------------------------------------------------------
def _last_iteration_step(recording: Path, trial: str, min_iterations: int = 3) -> tuple[int, int, dict]:
    rows = steps_rows(recording, trial)
    last = max((r for r in rows if r["iteration"] >= min_iterations - 1), key=lambda r: (r["training_step"], r["iteration"]))
    return last["training_step"], last["iteration"], last


@pytest.mark.parametrize("trial", [BUGGED, FIXED])
def test_the_samples_table_is_the_stores_per_sample_rows(service, recording, trial):
    step, iteration, step_row = _last_iteration_step(recording, trial)
    columns = [SampleColumn("loss_per_sample", "loss_per_sample"),
               SampleColumn("helper_partial_sums", "partial_sums", statistic="max"),
               SampleColumn("output", "output", statistic=NEURON, neuron=2),
               SampleColumn("subnet_mem__out", "subnet_mem__out", kind="gradients", statistic="abs_mean")]
    table = service.samples_table(trial, step, iteration, columns)
    assert table.type_of_execution == step_row["type_of_execution"] and table.missing == []
    assert [r["sample"] for r in table.rows] == sorted(step_row["samples"])
    categories = dict(zip(step_row["samples"], step_row["categories"] or [None] * len(step_row["samples"])))
    for row in table.rows:
        assert row["category"] == categories[row["sample"]]
        assert row["type_of_execution"] == step_row["type_of_execution"]
        for column in columns:
            (stored,) = store_rows(recording, trial, training_step=step, iteration=iteration, node=column.node_id,
                                   role=column.role, kind=column.kind, aggregation="sample", sample=row["sample"])
            expected = stored["neurons"][2] if column.statistic == NEURON else stored[column.statistic]
            assert row[column.key] == pytest.approx(expected, rel=1e-6), (column, row)


def test_a_column_without_samples_is_empty_and_named(service, recording):
    step, iteration, _ = _last_iteration_step(recording, BUGGED)
    column = SampleColumn("subnet_pre", "weight0")  # a parameter: no batch, no samples
    table = service.samples_table(BUGGED, step, iteration, [column])
    assert table.missing == [column.label] and all(row[column.key] is None for row in table.rows)


def test_the_column_choices_are_exactly_the_tensors_with_samples(service, recording):
    step, iteration, _ = _last_iteration_step(recording, BUGGED)
    choices = service.sample_columns(BUGGED, step, iteration)
    stored = {(r["node"], r["role"], r["kind"]) for r in store_rows(recording, BUGGED, training_step=step,
                                                                    iteration=iteration, aggregation="sample")}
    this_iteration = [c for c in choices if not c.node_id.endswith("*old")]
    assert {(c.node_id, c.role, c.kind) for c in this_iteration} == stored and len(this_iteration) == len(stored)
    assert ("loss_per_sample", "loss_per_sample", "forward") in stored
    earlier = {(r["node"] + "*old", r["role"], r["kind"]) for r in store_rows(
        recording, BUGGED, training_step=step, iteration=iteration - 1, aggregation="sample")}
    assert {(c.node_id, c.role, c.kind) for c in choices if c.node_id.endswith("*old")} <= earlier
    assert ("subnet_mem__out*old", "subnet_mem__out", "forward") in {(c.node_id, c.role, c.kind) for c in choices}


@pytest.mark.parametrize("key", ["a|b|forward|mean", "a|b|gradients|neuron:3", "x*old|x|forward|svd_max"])
def test_a_column_key_reads_back(key):
    assert SampleColumn.parse(key).key == key


@pytest.mark.parametrize("junk", [None, 3, "", "a|b|c", "a|b|forward|nope", "a|b|forward|neuron:-1",
                                  "a|b|forward|neuron:" + "9" * 20, "||forward|mean", "a|b|forward|mean:1"])
def test_a_junk_column_key_is_none(junk):
    assert SampleColumn.parse(junk) is None


# -- neurons, steps, comparison ------------------------------------------------------------------------------
def test_neuron_values_are_the_stored_row(service, recording):
    selection = service.resolve({"node_id": "subnet_mem", "roles": {"subnet_mem": "weight"}}).selection
    neurons = service.neuron_values(selection)
    aggregation, sample = parse_aggregation(selection.aggregation)
    (stored,) = store_rows(recording, selection.trial, training_step=selection.training_step, node="subnet_mem",
                           role="weight", kind=selection.kind, iteration=-1, aggregation=aggregation, sample=sample)
    assert neurons.values == pytest.approx(stored["neurons"]) and neurons.shape == stored["shape"] == [16, 32]
    assert neurons.total == stored["num_neurons"] == 512


@pytest.mark.parametrize("type_", [ANY_TYPE, "most frequent"])
def test_adjacent_steps_walk_the_recorded_steps_of_a_type(service, recording, type_):
    rows = steps_rows(recording, FIXED)
    if type_ != ANY_TYPE:
        counts = Counter(r["type_of_execution"] for r in rows if r["iteration"] == 0)
        type_ = counts.most_common(1)[0][0]
        assert counts[type_] >= 3, counts
    steps = sorted({r["training_step"] for r in rows if type_ == ANY_TYPE or r["type_of_execution"] == type_})
    assert service.adjacent_step(FIXED, type_, steps[1], offset=1) == steps[2]
    assert service.adjacent_step(FIXED, type_, steps[1], offset=-1) == steps[0]
    assert service.adjacent_step(FIXED, type_, steps[0], offset=-1) == steps[0]  # clamped
    assert service.adjacent_step(FIXED, type_, steps[-1], offset=5) == steps[-1]
    assert service.adjacent_step(FIXED, type_, 0, index=len(steps) - 1) == steps[-1]
    between = steps[1] + 1  # not a step of this type: the next one after it, or the one before
    assert service.adjacent_step(FIXED, type_, between, offset=1) == steps[2]
    assert service.adjacent_step(FIXED, type_, between, offset=-1) == steps[1]
    assert service.adjacent_step(FIXED, "no_such_type", steps[0], offset=1) is None


def test_a_comparison_is_both_stored_rows_and_their_difference(service, recording):
    pinned = service.resolve({"trial": BUGGED, "node_id": "output"}).selection
    current = service.resolve({"trial": FIXED, "node_id": "output", "training_step": pinned.training_step}).selection
    comparison = service.compare(pinned, current)
    for selection, row in ((pinned, comparison.pinned_row), (current, comparison.current_row)):
        (stored,) = store_rows(recording, selection.trial, training_step=selection.training_step, node="output",
                               role="output", kind="forward", iteration=selection.data_iteration, aggregation="mean")
        assert row["mean"] == stored["mean"] and row["max"] == stored["max"]
    assert comparison.deltas["mean"] == pytest.approx(comparison.current_row["mean"] - comparison.pinned_row["mean"])


def test_the_counterpart_is_the_same_tensor_in_another_trial_or_step(service, recording):
    here = service.resolve({"trial": BUGGED, "node_id": "subnet_mem__out", "kind": "gradients",
                            "aggregation": "sample:2"}).selection
    steps = sorted({r["training_step"] for r in steps_rows(recording, FIXED)})
    there = service.counterpart(here, trial=FIXED)
    assert there.notices == [] and there.selection.trial == FIXED
    same = ("training_step", "node_id", "role", "kind", "aggregation")
    assert {k: there.selection.to_dict()[k] for k in same} == {k: here.to_dict()[k] for k in same}
    later = service.counterpart(here, training_step=steps[-1] + 3)  # no such step: the nearest, and a notice
    assert later.selection.training_step == max(r["training_step"] for r in steps_rows(recording, BUGGED))
    assert any("not recorded" in n for n in later.notices)


# -- chunk listing is the store's --------------------------------------------------------------------------
def test_chunk_names_come_from_the_store_and_never_leave_the_group(recording):
    from comgra.store import GroupReader

    group = GroupReader(recording)
    names = group.chunk_names(BUGGED, "steps")
    on_disk = sorted(p.name for p in layout.rank_dir(recording / "trials" / BUGGED, "steps", 0).glob("*.parquet"))
    assert names == on_disk == group.trial(BUGGED).chunk_names("steps") and names
    for outside in ("..", "../..", "", ".", f"{BUGGED}/..", "no_such_trial"):
        assert group.chunk_names(outside, "steps") == []
