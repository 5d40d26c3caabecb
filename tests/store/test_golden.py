"""The reader opens every released format version: a tiny recording per version is committed as data.

``tests/golden/format_v1`` was written once by ``tests/golden/make_format_v1.py``; it must never be
regenerated. The values asserted here were worked out by hand from that script's inputs.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from comgra.store import GroupReader
from comgra.store import format as fmt

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
VERSIONS = {1: GOLDEN / "format_v1" / "golden_group", 2: GOLDEN / "format_v2" / "golden_group",
            3: GOLDEN / "format_v3" / "golden_group"}


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_version_up_to_the_current_one_has_a_golden_recording() -> None:
    assert sorted(VERSIONS) == list(range(1, fmt.FORMAT_VERSION + 1))


@pytest.mark.parametrize("group_dir", VERSIONS.values(), ids=[f"v{v}" for v in VERSIONS])
def test_golden_recording_opens_without_being_changed(group_dir: Path) -> None:
    before = _snapshot(group_dir)
    group = GroupReader(group_dir)
    assert group.trials() == ["golden_trial"]
    trial = group.trial("golden_trial")
    trial.steps(), trial.kpis(), trial.notes(), trial.selection(training_step=0)
    assert trial.problems == []
    assert _snapshot(group_dir) == before


def test_golden_v1_contents() -> None:
    trial = GroupReader(VERSIONS[1]).trial("golden_trial")
    assert trial.metadata["format_version"] == 1
    assert trial.metadata["types_of_execution"] == ["02_iterations"]
    assert [m["name"] for m in trial.metadata["modules"]] == ["model"]

    index = trial.steps().to_pylist()
    assert [(r["training_step"], r["iteration"]) for r in index] == [(0, 0), (0, 1), (2, 0), (2, 1)]
    assert {(r["type_of_execution"], r["batch_size"], tuple(r["kinds"]), tuple(r["samples"])) for r in index} == {
        ("02_iterations", 3, ("forward", "gradients"), (0, 1))}

    first, last = (trial.graph(index[i]["graph"]) for i in (0, 1))
    assert {(e["source"], e["target"]) for e in first["edges"]} == {
        ("initial_memory", "memory"), ("model.cell", "memory"), ("x", "memory"), ("x", "helper")}
    assert {(e["source"], e["target"]) for e in last["edges"]} == {
        ("memory*old", "memory"), ("model.cell", "memory"), ("x", "memory"), ("x", "helper"),
        ("memory", "y"), ("model.readout.weight", "y"), ("model.readout.bias", "y"), ("y", "loss")}
    roles = {n["id"]: (n["role"], sorted(n["roles"])) for n in last["nodes"]}
    assert roles["helper"] == ("intermediate", ["double", "negative"])
    assert roles["model.cell"] == ("parameter", ["model.cell.bias", "model.cell.weight"])
    assert roles["y"][0] == "output" and roles["loss"][0] == "loss" and roles["x"][0] == "input"

    # x = arange(6).reshape(3, 2) + 10 * iteration + 100 * step; sample 1 is row [2, 3].
    (x,) = trial.selection(training_step=2, node="x", kind="forward", iteration=1, aggregation="sample",
                            sample=1).to_pylist()
    assert (x["neurons"], x["mean"], x["min"], x["max"], x["shape"]) == ([212.0, 213.0], 212.5, 212.0, 213.0, [3, 2])
    (double,) = trial.selection(training_step=0, node="helper", role="double", iteration=0, kind="forward",
                                aggregation="mean").to_pylist()
    assert double["neurons"] == [4.0, 6.0] and double["tensor_name"] == "helper__double"
    # memory_0 = cell([x, 0]): [0.5 * x0 + 0.125, -0.5 * x1 - 0.125]; at step 2, sample 1: [101.125, -101.625].
    (memory,) = trial.selection(training_step=2, node="memory", kind="forward", iteration=0, aggregation="sample",
                                sample=1).to_pylist()
    assert memory["neurons"] == [101.125, -101.625]
    # loss = mean(y), y = memory @ [1, 2]: d loss / d y = 1/3, d loss / d memory = [1/3, 2/3].
    (gradient,) = trial.selection(training_step=0, kind="gradients", node="memory", iteration=1,
                                  aggregation="mean").to_pylist()
    assert gradient["neurons"] == pytest.approx([1 / 3, 2 / 3])
    (loss_gradient,) = trial.selection(training_step=0, kind="gradients", node="loss").to_pylist()
    assert (loss_gradient["aggregation"], loss_gradient["neurons"]) == ("none", [1.0])
    (bias,) = trial.selection(training_step=0, node="model.cell", role="model.cell.bias", kind="forward").to_pylist()
    assert (bias["iteration"], bias["neurons"], bias["tensor_type"]) == (-1, [0.125, -0.125], "parameter")

    # The mean over the batch of each sample's minimum: samples start at 0, 2, 4 (+ 200 at step 2).
    assert trial.series(node="x", role="x", iteration=0, statistic="min")["value"].to_pylist() == [2.0, 202.0]
    assert trial.series(node="x", role="x", iteration=0, aggregation="abs_max",
                        statistic="max")["value"].to_pylist() == [5.0, 205.0]
    assert trial.kpis()["timepoint"].to_pylist() == [0, 1, 2]
    assert trial.kpis()["value"].to_pylist() == [-7.65625, -70.15625, -132.65625]
    assert trial.notes() == ["golden recording of format_version 1"]


def test_golden_v1_rows_are_rank_0() -> None:
    trial = GroupReader(VERSIONS[1]).trial("golden_trial")
    assert trial.ranks() == [0]
    assert set(trial.steps()["rank"].to_pylist()) == {0} and set(trial.kpis()["rank"].to_pylist()) == {0}
    assert set(trial.selection(training_step=0)["rank"].to_pylist()) == {0}
    assert trial.selection(training_step=0, rank=1).num_rows == 0
    assert trial.series(node="x", role="x", iteration=0, statistic="min", rank=0)["value"].to_pylist() == [2.0, 202.0]


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("rank", [0, 1])
def test_golden_v2_contents_rank_by_rank(rank: int, version: int) -> None:
    """make_format_v2.py and make_format_v3.py: x = arange(6).reshape(3, 2) + 100 * step + 1000 * rank,
    y = x @ [1, 2], loss = mean(y)."""
    trial = GroupReader(VERSIONS[version]).trial("golden_trial")
    assert trial.metadata["format_version"] == version and trial.metadata["world_size"] == 2
    assert trial.ranks() == [0, 1]
    index = trial.steps(rank=rank).to_pylist()
    assert [(r["training_step"], r["rank"]) for r in index] == [(0, rank), (2, rank)]
    assert trial.steps().num_rows == 4
    offset = 1000 * rank
    (x,) = trial.selection(training_step=2, node="x", kind="forward", aggregation="sample", sample=1,
                           rank=rank).to_pylist()
    assert (x["neurons"], x["rank"]) == ([202.0 + offset, 203.0 + offset], rank)
    (weight_gradient,) = trial.selection(training_step=0, node="model.weight", kind="gradients",
                                         rank=rank).to_pylist()
    # d mean(y) / d w = the mean of x over the batch (float32 sums: not exact at 1000)
    assert weight_gradient["neurons"] == pytest.approx([2.0 + offset, 3.0 + offset], rel=1e-6)
    series = trial.series(node="x", role="x", iteration=0, statistic="min", rank=rank)
    assert series["value"].to_pylist() == [2.0 + offset, 202.0 + offset]
    assert trial.kpis(rank=rank)["value"].to_pylist() == [8.0 + 3 * offset, 308.0 + 3 * offset, 608.0 + 3 * offset]
    assert trial.notes(rank=rank) == [f"golden recording of format_version {version}, rank {rank}"]


@pytest.mark.parametrize("version", [2, 3])
def test_golden_v2_all_ranks_side_by_side(version: int) -> None:
    trial = GroupReader(VERSIONS[version]).trial("golden_trial")
    series = trial.series(node="x", role="x", iteration=0, statistic="min")
    assert list(zip(series["rank"].to_pylist(), series["training_step"].to_pylist(), series["value"].to_pylist())) \
        == [(0, 0, 2.0), (0, 2, 202.0), (1, 0, 1002.0), (1, 2, 1202.0)]
    assert sorted(trial.selection(training_step=0, node="x", kind="forward", aggregation="mean")["rank"].to_pylist()) == [0, 1]


def test_golden_v3_is_one_file_per_table_and_rank_with_hive_partitions() -> None:
    """Format 3: every table a Hive-partitioned dataset that pyarrow reads as it is, ``rank`` from the folders."""
    import pyarrow.dataset as ds

    group_dir = VERSIONS[3]
    trial = GroupReader(group_dir).trial("golden_trial")
    for table in ("steps", "tensors", "kpis", "notes", "runinfo", "sentinels"):
        files = sorted((group_dir / table).rglob("*.parquet"))
        assert [p.parent.name for p in files] == ["rank=0", "rank=1"], table
        assert all(p.parent.parent.name == "trial=golden_trial" for p in files)
        plain = ds.dataset(group_dir / table, format="parquet", partitioning="hive").to_table()
        assert "rank" not in ds.dataset(files[0], format="parquet").schema.names
        assert plain.num_rows == {"steps": trial.steps, "kpis": trial.kpis}.get(table, lambda: plain)().num_rows
    runinfo = trial.evidence("runinfo")
    assert "value" in runinfo.column_names and "text" not in runinfo.column_names
    assert trial.evidence("sentinels").schema.field("abs_max").type == fmt.SCHEMAS["sentinels"].field("abs_max").type
