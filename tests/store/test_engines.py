"""Format 3 read by the engines users run, without path tricks, row for row against comgra's reader.

One real recording (the recorder on a small MLP): trials whose ids hold ``=``, ``%`` and a space, one of them
recorded by two ranks. Each engine is pointed at a table's root (``GROUP/tensors``) and must give back every row
comgra's reader gives, with ``trial`` and ``rank`` from the Hive partition folders. DuckDB, pyarrow and polars are
quick; Dask, Ray Data and Spark start a runtime each (one per module), so they are marked slow.
"""
from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from comgra.store import GroupReader
from comgra.store import format as fmt

torch = pytest.importorskip("torch")

TRIALS = {"lr=0.1": 1, "50% dropout": 1, "plain": 2}  # trial id -> ranks that record it
STEPS = 4
KEY = ["trial", "rank", "training_step", "kind", "iteration", "node", "role", "aggregation", "sample"]


def _record(root: Path, trial_id: str, rank: int, world_size: int) -> None:
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        recorder = ComgraRecorder(root, "group", trial_id, DecisionMakerForRecordingsHardcoded(set(range(STEPS))),
                                  max_num_batch_size_to_record=2, max_num_neurons_to_record=4, flush_seconds=0.0)
        torch.manual_seed(len(trial_id) + rank)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        recorder.track_module("model", model)
        recorder.add_note(f"{trial_id} rank {rank}")
        for step in range(STEPS):
            recorder.start_batch(step, 3, type_of_execution="main")
            recorder.start_iteration()
            x = torch.randn(3, 3)
            recorder.register_tensor("x", x, is_input=True)
            y = model(x)
            recorder.register_tensor("y", y)
            loss = y.pow(2).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            loss.backward()
            recorder.record_current_gradients("gradients")
            recorder.record_kpi_in_graph("loss", "mean", loss, record_even_if_recording_is_inactive=True)
            recorder.finish_iteration()
            recorder.finish_batch()
            optimizer.step()
            optimizer.zero_grad()
        recorder.finalize()
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("engines")
    for trial_id, ranks in TRIALS.items():
        for rank in range(ranks):
            _record(root, trial_id, rank, ranks)
    return root / "group"


def _plain(value: Any) -> Any:
    """A value as Python compares it, whatever the engine handed back (NumPy scalars and arrays, pandas' NA)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, float) and math.isnan(value):
        return None  # pandas turns a null float into NaN; comgra's reader keeps it null
    if value is not None and not isinstance(value, (str, bytes, int, float, bool)):
        try:
            return None if value != value else value  # pandas.NA and NaT
        except TypeError:
            return None
    return value


def _rows(records: Iterator[dict[str, Any]], columns: list[str]) -> list[str]:
    out = []
    for record in records:
        row = {c: _plain(record[c]) for c in columns}
        row["rank"], row["trial"] = int(row["rank"]), str(row["trial"])
        out.append(repr(tuple(row[c] for c in columns)))
    return sorted(out)


def _expected(group: Path, table: str) -> list[str]:
    """Every row of ``table`` as comgra's reader returns it, with its trial."""
    reader = GroupReader(group)
    records = []
    for trial_id in reader.trials():
        trial = reader.trial(trial_id)
        if table == "tensors":
            rows = trial.steps_selection(list(range(STEPS)))
        else:
            rows = {"steps": trial.steps, "kpis": trial.kpis}[table]()
        records += [{**row, "trial": trial_id} for row in rows.to_pylist()]
    reader.close()
    return _rows(iter(records), COLUMNS[table])


COLUMNS = {"tensors": [*KEY, "tensor_name", "tensor_type", "shape", *fmt.STATISTICS, "num_neurons", "neurons"],
           "steps": ["trial", "rank", "training_step", "iteration", "graph", "batch_size", "kinds", "samples"],
           "kpis": ["trial", "rank", "kpi_group", "kpi_name", "timepoint", "value"]}


def test_the_recording_is_format_3_with_escaped_trial_folders(group: Path) -> None:
    reader = GroupReader(group)
    assert reader.trials() == sorted(TRIALS)
    assert reader.trial("plain").ranks() == [0, 1]
    names = sorted(p.name for p in (group / "tensors").iterdir())
    assert names == ["trial=50%25%20dropout", "trial=lr%3D0.1", "trial=plain"]
    for table in ("steps", "tensors", "kpis", "notes"):  # finalize compacted each table of each rank to one file
        assert all(len(list(p.iterdir())) == 1 for p in (group / table).glob("trial=*/rank=*")), table
    assert not [p for p in group.rglob("*.json") if p.parts[len(group.parts)] != fmt.TRIALS_DIR]
    reader.close()


def test_duckdb_reads_every_table_with_hive_partitioning(group: Path) -> None:
    import duckdb

    for table in ("tensors", "steps", "kpis"):
        relation = duckdb.sql(f"SELECT * FROM read_parquet('{group}/{table}/**/*.parquet', hive_partitioning = true)")
        names = relation.columns
        assert _rows((dict(zip(names, r)) for r in relation.fetchall()), COLUMNS[table]) == _expected(group, table)


def test_pyarrow_dataset_reads_a_table_root_with_hive_partitioning(group: Path) -> None:
    import pyarrow.dataset as ds

    for table in ("tensors", "steps", "kpis"):
        rows = ds.dataset(group / table, format="parquet", partitioning="hive").to_table().to_pylist()
        assert _rows(iter(rows), COLUMNS[table]) == _expected(group, table)


def test_polars_reads_a_table_with_hive_partitioning(group: Path) -> None:
    polars = pytest.importorskip("polars")
    frame = polars.read_parquet(f"{group}/tensors/**/*.parquet", hive_partitioning=True)
    assert _rows(iter(frame.to_dicts()), COLUMNS["tensors"]) == _expected(group, "tensors")


@pytest.mark.slow
def test_dask_reads_a_table_root(group: Path) -> None:
    dd = pytest.importorskip("dask.dataframe")
    frame = dd.read_parquet(str(group / "tensors")).compute()
    assert _rows(iter(frame.to_dict("records")), COLUMNS["tensors"]) == _expected(group, "tensors")
    # Compacted: one partition per trial and rank, not one per flush.
    assert dd.read_parquet(str(group / "tensors")).npartitions == sum(TRIALS.values())


@pytest.fixture(scope="module")
def ray_data() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray.data
    ray.shutdown()


@pytest.mark.slow
def test_ray_data_reads_a_table_root(group: Path, ray_data: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Ray's own deprecations of its internals, not ours
        rows = ray_data.read_parquet(str(group / "tensors")).take_all()
    assert _rows(iter(rows), COLUMNS["tensors"]) == _expected(group, "tensors")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    import shutil

    if shutil.which("java") is None:
        pytest.skip("Spark needs Java (.ci/run installs openjdk-17-jre-headless)")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[1]").appName("comgra-format-3")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.mark.slow
def test_spark_reads_each_table_root_and_merges_the_schemas_of_all(group: Path, spark: Any) -> None:
    for table in ("tensors", "steps", "kpis"):
        rows = (row.asDict(recursive=True) for row in spark.read.parquet(str(group / table)).collect())
        assert _rows(rows, COLUMNS[table]) == _expected(group, table)
    # Every Parquet file of the group at once: one name has one type across all tables (format.FILE_RENAMES), so
    # the schemas merge (format 2 failed here: abs_max float/double, value double/string).
    merged = (spark.read.option("mergeSchema", "true").option("recursiveFileLookup", "true")
              .option("pathGlobFilter", "*.parquet").parquet(str(group)))
    import pyarrow.dataset as ds

    roots = [group / t for t in fmt.TABLES if (group / t).is_dir()]
    assert merged.count() == sum(ds.dataset(r, format="parquet", partitioning="hive").count_rows() for r in roots)
    assert {"text", "abs_max_f64", "value", "abs_max", "neurons", "kpi_group"} <= set(merged.columns)
    for table in ("tensors", "runinfo", "sentinels"):  # and each table's own root with its partitions
        schema = spark.read.option("mergeSchema", "true").parquet(str(group / table)).schema
        assert schema["rank"].dataType.simpleString() == "int" and "trial" in schema.fieldNames()
