"""Engines a team already runs, reading a table of a recording from the S3 server, row for row against comgra.

Each engine reads ``layout.table_root(GROUP, "tensors")`` (``GROUP/tensors/trial=<id>/rank=<r>/*.parquet``, format 3)
with Hive partitioning, through the same pyarrow filesystem comgra uses (DuckDB over an Arrow dataset, since its
httpfs extension is downloaded at run time) or its own S3 client (polars). ``test_engines_read_a_table_root`` lays
the rows comgra's reader returns out as that dataset in the bucket, so it holds for the engines and the trial id
escaping whatever layout the writer has; ``test_engines_read_the_recording`` reads the table root the recorder
itself uploaded, and runs once the recorder writes format 3 (skipped before).
"""
from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from s3_server import make_bucket
from test_object_storage import GROUP, train

from comgra.store import GroupReader, layout
from comgra.store import format as fmt
from comgra.store.filesystems import Location, open_location

TRIALS = ("lr=0.1%x", "plain")  # an id with the characters a partition folder escapes
STEPS = 4


def comgra_rows(reader: GroupReader) -> dict[str, int]:
    return {trial: sum(reader.trial(trial).selection(training_step=s).num_rows for s in range(STEPS))
            for trial in reader.trials()}


def read_rows(engine: str, location: Location, root: str) -> dict[str, int]:
    """Rows per trial of the table at ``root`` (a path in ``location.filesystem``), read by ``engine``."""
    fs = location.filesystem
    if engine in ("pyarrow", "duckdb"):
        dataset = ds.dataset(root, filesystem=fs, format="parquet", partitioning="hive")
        if engine == "pyarrow":
            return _counts(dataset.to_table(columns=["trial"]))
        import duckdb

        with duckdb.connect() as con:
            return dict(con.execute("SELECT trial, count(*) FROM dataset GROUP BY trial").fetchall())
    if engine == "polars":
        import polars as pl

        options = {"aws_endpoint_url": os.environ["AWS_ENDPOINT_URL"], "aws_allow_http": "true",
                   "aws_region": os.environ["AWS_DEFAULT_REGION"],
                   "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
                   "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"]}
        frame = pl.scan_parquet(f"s3://{root}/**/*.parquet", hive_partitioning=True, storage_options=options)
        return dict(frame.group_by("trial").len().collect().iter_rows())
    if engine == "dask":
        import dask.dataframe as dd

        frame = dd.read_parquet(root, filesystem=fs, dataset={"partitioning": {"flavor": "hive"}}, columns=["trial"])
        return {str(k): int(v) for k, v in frame.compute()["trial"].astype(str).value_counts().items()}
    if engine == "ray":
        import ray

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        try:
            data = ray.data.read_parquet(root, filesystem=fs, partitioning=ray.data.datasource.Partitioning("hive"))
            table = pa.concat_tables(ray.get(data.to_arrow_refs()))
        finally:
            ray.shutdown()
        return _counts(table.select(["trial"]))
    raise AssertionError(engine)


def _counts(table: pa.Table) -> dict[str, int]:
    counted = table.group_by("trial").aggregate([("trial", "count")]).to_pydict()
    return {str(k): int(v) for k, v in zip(counted["trial"], counted["trial_count"])}


# Ray Data warns about its own deprecated settings (use_push_based_shuffle, use_polars) as it reads.
ENGINES = ["pyarrow", "duckdb", "polars", "dask", pytest.param("ray", marks=[
    pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning:ray")])]


@pytest.fixture(scope="module")
def recording(s3_server: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two trials recorded to a bucket of the S3 server; (group URL, comgra's rows per trial)."""
    monkeypatch = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("cache")
    for name, value in {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1", "XDG_CACHE_HOME": str(cache)}.items():
        monkeypatch.setenv(name, value)
    url = f"s3://{make_bucket(s3_server)}/runs"
    for trial in TRIALS:
        train(url, trial, steps=STEPS)
    reader = GroupReader(f"{url}/{GROUP}")
    yield f"{url}/{GROUP}", reader, comgra_rows(reader)
    reader.close()
    monkeypatch.undo()


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_read_a_table_root(recording: Any, engine: str, monkeypatch) -> None:
    url, reader, expected = recording
    location = open_location(url + "-engines")
    group = PurePosixPath(location.path)
    for trial in TRIALS:  # comgra's rows of each trial, as the table's Hive-partitioned dataset in the bucket
        rows = pa.concat_tables([reader.trial(trial).selection(training_step=s) for s in range(STEPS)])
        rows = rows.drop_columns([c for c in ("trial", "rank") if c in rows.column_names])
        path = layout.partition_dir(group, "tensors", trial, 0) / "part-0.parquet"  # type: ignore[arg-type]
        pq.write_table(rows, str(path), filesystem=location.filesystem)
    root = str(layout.table_root(group, "tensors"))  # type: ignore[arg-type]
    assert read_rows(engine, location, root) == expected
    assert set(expected) == set(TRIALS) and all(expected.values())


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_read_the_recording(recording: Any, engine: str) -> None:
    url, reader, expected = recording
    if fmt.FORMAT_VERSION < 3:
        pytest.skip("the recorder writes format 3's table roots once the layout work is merged")
    location = open_location(url)
    root = str(layout.table_root(PurePosixPath(location.path), "tensors"))  # type: ignore[arg-type]
    assert read_rows(engine, location, root) == expected
