"""The findings of a scan as a Parquet table in the group's layout (issue 30 item 3), and the per-trial scan mapped
by another engine (issue 30 item 2: the Dask example of docs/sweeps.md). "Which trials have dying units" is one
DuckDB query over ``GROUP/findings``, and its answer is what ``comgra scan --json`` printed; a rescan replaces a
trial's rows, never adds to them."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
TRIALS = 14  # t00000 and t00007 have ReLU units that never fire (sweep_groups.DEAD_EVERY)


def _scan(group, trials, *extra) -> list[dict]:
    chosen = [a for t in trials for a in ("--trial", t)]
    answer = subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", str(group), "--json", *chosen, *extra],
                            capture_output=True, text=True, timeout=900, check=False)
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)["findings"]


def _query(group, sql: str) -> list[tuple]:
    import duckdb

    source = f"read_parquet('{group}/findings/*/*/*.parquet', hive_partitioning = true)"
    return duckdb.sql(sql.replace("FINDINGS", source)).fetchall()


def test_which_trials_have_dying_units_is_one_query_and_a_rescan_replaces_the_rows(sweep) -> None:
    from comgra.store import GroupReader

    trials = GroupReader(sweep).trials()[:TRIALS]
    printed = _scan(sweep, trials)
    dead = sorted({f["trial"] for f in printed if f["detector"] == "dead_units"})
    assert {"t00000", "t00007"} <= set(dead)
    assert [row[0] for row in _query(sweep, "SELECT DISTINCT trial FROM FINDINGS WHERE detector = 'dead_units' "
                                            "ORDER BY trial")] == dead
    rows = _query(sweep, "SELECT trial, detector, node, training_step, message, severity FROM FINDINGS")
    assert sorted(rows) == sorted((f["trial"], f["detector"], f["node"], f["training_step"], f["message"],
                                   f["severity"]) for f in printed)
    assert _query(sweep, "SELECT count(DISTINCT trial) FROM FINDINGS")[0][0] <= TRIALS
    assert len(list(sweep.glob("findings/*/rank=0/*.parquet"))) == TRIALS  # a file per trial, findings or not

    again = _scan(sweep, trials, "--sensitivity", "2")  # more findings; each trial's rows replaced
    assert len(again) > len(printed)
    assert _query(sweep, "SELECT count(*), min(sensitivity), max(sensitivity) FROM FINDINGS")[0] == (len(again), 2.0, 2.0)
    _scan(sweep, trials)  # back at the default: its saved JSON is current, the table is written from it
    assert _query(sweep, "SELECT count(*), max(sensitivity) FROM FINDINGS")[0] == (len(printed), 1.0)


def test_the_table_reads_as_a_hive_dataset_with_pyarrow(sweep) -> None:
    import pyarrow.dataset as ds

    from comgra.analysis import findings_table

    _scan(sweep, ["t00007"])
    table = ds.dataset(sweep / "findings", format="parquet", partitioning="hive").to_table()
    assert set(table.column("trial").to_pylist()) == {"t00007"}
    assert set(table.schema.names) == set(findings_table.schema().names) | {"trial", "rank"}


def test_the_per_trial_scan_mapped_by_dask_is_comgra_scans_answer(sweep, tmp_path) -> None:
    """The Dask example of docs/sweeps.md, as written there."""
    import shutil

    dask_bag = pytest.importorskip("dask.bag")
    local = tmp_path / "local"
    shutil.copytree(sweep, local)

    from functools import partial

    from comgra.analysis import scan_trial, trial_ids

    group = str(sweep)
    chosen = trial_ids(group)[:6]
    scans = dask_bag.from_sequence(chosen, npartitions=3).map(partial(scan_trial, group)).compute(scheduler="threads")
    by_dask = sorted((f.trial, f.detector, f.node, f.message) for s in scans for f in s.findings)
    printed = _scan(local, chosen)
    assert by_dask == sorted((f["trial"], f["detector"], f["node"], f["message"]) for f in printed)
    assert {s.trial for s in scans} == set(chosen) and all(s.problems == [] for s in scans)
    assert len(list(sweep.glob("findings/*/rank=0/*.parquet"))) == 6
