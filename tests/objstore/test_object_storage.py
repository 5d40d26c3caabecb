"""Recording to and reading from object storage, against a real S3 server (moto) and a proxy that injects faults.

The user's view: ``ComgraRecorder("s3://bucket/runs", ...)``, then ``GroupReader("s3://bucket/runs/group")``, plain
pyarrow/DuckDB over the bucket, and the command line; every number compared with the local spool the run wrote.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.dataset as ds
import pytest

from comgra.errors import ConfigError, StoreError
from comgra.store import GroupReader, layout
from comgra.store.filesystems import open_location
from comgra.store.remote import Mirror
from comgra.store.uploader import Uploader, local_files

torch = pytest.importorskip("torch")

from comgra.capture.session import ComgraWarning  # noqa: E402
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402

GROUP = "sweep"
SECRET = "Xq7secretKEYnot4recording"
KEEP_SPOOL = Path(__file__).with_name("keep_spool.toml")


def train(root: str | Path, trial: str, steps: int = 12, pause: float = 0.0, **kwargs: Any) -> ComgraRecorder:
    """A small MLP trained for ``steps`` steps, every step recorded; finalized."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs.setdefault("flush_seconds", 0.02)
    kwargs.setdefault("config", KEEP_SPOOL)  # these tests compare the bucket with the spool the run wrote
    recorder = ComgraRecorder(root, GROUP, trial, DecisionMakerForRecordingsFrequencyPerType(1), **kwargs)
    recorder.track_module("main", model)
    for step in range(steps):
        x = torch.randn(4, 6)
        recorder.start_batch(step, 4)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        y = model(x)
        recorder.register_tensor("y", y)
        loss = y.pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        time.sleep(pause)
        if step % 3 == 2:
            recorder.flush()  # many small chunks, so that the writer merges them (parts deleted remotely too)
    recorder.finalize()
    return recorder


def rows(trial: Any, steps: range) -> list[str]:
    found = []
    for step in steps:
        table = trial.selection(training_step=step)
        found += sorted(repr(tuple(row.values())) for row in table.to_pylist())  # repr: NaN equals NaN
    return found


def assert_same_recording(remote: GroupReader, local: GroupReader, trial: str, steps: int) -> None:
    assert remote.trials() == local.trials()
    a, b = remote.trial(trial), local.trial(trial)
    assert a.steps().sort_by("training_step").to_pylist() == b.steps().sort_by("training_step").to_pylist()
    assert len(a.steps()) == steps
    assert rows(a, range(steps)) == rows(b, range(steps))
    assert a.problems == [] and b.problems == []


def plain_tensor_rows(url: str, trial: str) -> tuple[int, int]:
    """(rows, distinct rows) of the trial's tensors table in the bucket, read by DuckDB over a pyarrow dataset."""
    location = open_location(url)
    prefix = f"tensors/trial={layout.escape_partition_value(trial)}/"  # format 3: GROUP/tensors/trial=<id>/rank=<r>/
    keys = [location.key(k) for k in location.list_files() if k.startswith(prefix) and k.endswith(".parquet")]
    dataset = ds.dataset(keys, filesystem=location.filesystem, format="parquet")  # noqa: F841 - read by DuckDB
    with duckdb.connect() as con:
        total = con.execute("SELECT count(*) FROM dataset").fetchone()[0]
        distinct = con.execute("SELECT count(*) FROM (SELECT DISTINCT training_step, iteration, node, role, kind, "
                           "aggregation, sample FROM dataset)").fetchone()[0]
    return total, distinct


def test_a_recording_in_s3_reads_back_row_for_row_and_holds_no_credentials(s3_env: str, monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # moto takes any key; it must never reach the bucket
    recorder = train(f"{s3_env}/runs", "t1", steps=12)
    assert not recorder.options.root.is_relative_to(Path.cwd())  # the spool: the user's cache dir, not ./s3:
    assert not Path("s3:").exists()
    local = GroupReader(recorder.options.group_dir)
    remote = GroupReader(f"{s3_env}/runs/{GROUP}")
    assert remote.mirror is not None and remote.path != local.path
    assert_same_recording(remote, local, "t1", 12)
    total, distinct = plain_tensor_rows(f"{s3_env}/runs/{GROUP}", "t1")
    assert total == distinct == sum(len(local.trial("t1").selection(training_step=s)) for s in range(12))
    location = open_location(f"{s3_env}/runs/{GROUP}")
    objects = location.list_files()
    # The bucket holds what the spool holds, key for key (merged-away parts deleted remotely as well).
    assert set(objects) == set(local_files(recorder.options.group_dir))
    for key in objects:
        data = location.download(key)
        assert SECRET.encode() not in data and os.environ["AWS_ENDPOINT_URL"].encode() not in data, key


def test_file_urls_are_local_folders(tmp_path: Path) -> None:
    url = (tmp_path / "runs").as_uri()
    recorder = train(url, "t1", steps=3)
    assert recorder.options.root == tmp_path / "runs" and recorder.options.remote is None
    assert GroupReader(f"{url}/{GROUP}").trial("t1").steps().num_rows == 3


@pytest.mark.parametrize("root, names", [
    ("foo://bucket/runs", ["'foo'", "s3://"]),
    ("az://container/runs", ["comgra[azure]"]),
    ("s3:/bucket/runs", ["s3://bucket/runs"]),
    ("s3://", ["bucket"]),
])
def test_a_bad_url_fails_when_the_recorder_or_reader_is_created(root: str, names: list[str], tmp_path: Path,
                                                                 monkeypatch) -> None:
    if root.startswith("az://"):
        try:
            import adlfs  # noqa: F401
            pytest.skip("adlfs is installed here: no missing package to report")
        except ImportError:
            pass
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(ConfigError) as raised:
        ComgraRecorder(root, GROUP, "t1", DecisionMakerForRecordingsFrequencyPerType(1))
    for name in names:
        assert name in str(raised.value)
    with pytest.raises(ConfigError):
        GroupReader(f"{root}/{GROUP}" if "://" in root and not root.endswith("://") else root)
    assert list(tmp_path.iterdir()) == []  # no folder named s3: (nor anything else) here, and no spool


def test_a_missing_recording_in_a_bucket_is_a_store_error(s3_env: str) -> None:
    with pytest.raises(StoreError, match="No recording"):
        GroupReader(f"{s3_env}/nothing/here")


def test_the_reader_lists_the_bucket_once_per_poll(s3_env: str) -> None:
    train(f"{s3_env}/runs", "t1", steps=4)
    group = GroupReader(f"{s3_env}/runs/{GROUP}")
    group.mirror.refresh_seconds = 60.0
    listed = group.mirror.listings
    for _ in range(20):  # the questions of one page: trials, chunk names per table, a selection
        group.trials()
        for table in ("steps", "tensors", "kpis"):
            group.chunk_names("t1", table)
        group.trial("t1").selection(training_step=1)
    assert group.mirror.listings == listed
    group.mirror.refresh_seconds = 0.0
    group.mirror.last_refresh_seconds = 0.0  # else a slow listing (a loaded machine) spaces the next one out
    group.trials()
    assert group.mirror.listings == listed + 1


def test_a_live_run_appears_in_the_mirror_and_merged_parts_go(s3_env: str, tmp_path: Path) -> None:
    local = tmp_path / "group"
    (local / "trials" / "t" / "tensors").mkdir(parents=True)
    (local / "trials" / "t" / "steps").mkdir()
    location = open_location(f"{s3_env}/g")
    uploader = Uploader(local, location, journal_root=tmp_path)
    parts = [local / "trials" / "t" / "tensors" / f"part{i}.parquet" for i in range(3)]
    for i, part in enumerate(parts):
        part.write_bytes(bytes([i]) * 100)
    (local / "trials" / "t" / "steps" / "s0.parquet").write_bytes(b"s" * 10)
    assert uploader.run_pass().uploaded == 4
    mirror = Mirror(location, tmp_path / "mirror", refresh_seconds=0)
    mirror.refresh(force=True)
    assert sorted(mirror._local_keys()) == sorted(location.list_files())
    merged = local / "trials" / "t" / "tensors" / "merged.parquet"
    merged.write_bytes(b"m" * 300)
    for part in parts:
        part.unlink()
    # A new uploader (the next run of the trial, or comgra sync) finishes what the first one left.
    result = Uploader(local, location, journal_root=tmp_path).run_pass()
    assert (result.uploaded, result.deleted) == (1, 3)
    assert sorted(location.list_files()) == sorted(["trials/t/tensors/merged.parquet", "trials/t/steps/s0.parquet"])
    mirror.refresh(force=True)
    assert sorted(mirror._local_keys()) == sorted(location.list_files())
    assert (mirror.local / "trials/t/tensors/merged.parquet").read_bytes() == b"m" * 300
    # Deleting the spool's copy of a trial (to free the node's disk) deletes nothing in the store.
    import shutil

    shutil.rmtree(local / "trials" / "t")
    assert Uploader(local, location, journal_root=tmp_path).run_pass().deleted == 0
    assert len(location.list_files()) == 2


def test_comgra_sync_and_repair_on_a_url(s3_env: str, tmp_path: Path, capsys) -> None:
    from comgra.cli.app import main

    recorder = train(tmp_path / "runs", "t1", steps=6)
    assert main(["sync", str(recorder.options.group_dir), f"{s3_env}/copy/{GROUP}"]) == 0
    assert "0 left" in capsys.readouterr().out
    assert main(["sync", str(recorder.options.group_dir), f"{s3_env}/copy/{GROUP}"]) == 0
    assert "0 file(s)" in capsys.readouterr().out  # nothing is sent twice
    assert_same_recording(GroupReader(f"{s3_env}/copy/{GROUP}"), GroupReader(recorder.options.group_dir), "t1", 6)
    assert main(["repair", f"{s3_env}/copy/{GROUP}"]) == 0
    assert "t1" in capsys.readouterr().out
    assert main(["sync", "s3://x/y", str(tmp_path)]) == 2
    assert main(["--path", "nope://bucket/g"]) == 2


def test_the_spool_limit_stops_recording_once_and_training_goes_on(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing answers: every upload fails
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    config = tmp_path / "comgra.toml"
    config.write_text("[storage]\nspool_limit_gb = 0.000001\nupload_timeout_s = 1.0\n"
                      "[storage.options.s3]\nconnect_timeout = 0.5\nrequest_timeout = 0.5\n")
    with pytest.warns(ComgraWarning) as warned:
        # long enough (15 s) for the uploader to find the spool full while the run trains, even when its first pass
        # spends seconds on failing connections
        recorder = train("s3://bucket/runs", "t1", steps=150, pause=0.1, config=config)
    messages = [str(w.message) for w in warned]
    assert sum("spool" in m and "stopped recording" in m for m in messages) == 1, messages
    assert any("comgra sync" in m for m in messages), messages  # finalize says what is left and how to send it
    assert recorder.session is not None and recorder.session.broken


def test_a_question_does_not_wait_for_a_refresh_under_way(s3_env: str, tmp_path: Path) -> None:
    import threading

    train(f"{s3_env}/runs", "t1", steps=3)
    group = GroupReader(f"{s3_env}/runs/{GROUP}")
    mirror = group.mirror
    listing = mirror.location.list_files
    entered, release = threading.Event(), threading.Event()

    def slow_listing() -> dict[str, tuple[int, int]]:
        entered.set()
        release.wait(30)
        return listing()

    object.__setattr__(mirror.location, "list_files", slow_listing)
    mirror.refresh_seconds = 0.0
    mirror._refreshed_at = time.monotonic() - 60
    poll = threading.Thread(target=group.trials)
    poll.start()
    assert entered.wait(30)
    started = time.monotonic()
    assert group.trials() == ["t1"]  # answered from the mirror as it is, while the poll's listing is under way
    assert group.trial("t1").steps().num_rows == 3
    assert time.monotonic() - started < 5
    release.set()
    poll.join(30)


def test_findings_of_a_scan_on_a_url_go_to_the_bucket(s3_env: str, tmp_path: Path, monkeypatch) -> None:
    """``comgra scan URL`` on one machine (its own mirror): the findings table and the signed findings JSON land in
    the bucket, where DuckDB reads the rows the scan printed, and a second machine (a fresh mirror, the same user's
    key) reads the saved findings instead of scanning again."""
    import json
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from comgra.analysis import saved
    from comgra.analysis.findings import ScanOptions, trial_signature

    url = f"{s3_env}/runs/{GROUP}"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    recorder = ComgraRecorder(f"{s3_env}/runs", GROUP, "t1", DecisionMakerForRecordingsFrequencyPerType(1))
    recorder.track_module("main", model)
    for step in range(8):
        x = torch.randn(4, 6)
        if step >= 5:
            x[0, 0] = float("nan")  # a finding the scan reports (non-finite values from step 5)
        recorder.start_batch(step, 4)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        loss = model(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward()
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "machine1"), "PYTHONPATH": os.pathsep.join(sys.path)}
    scan = subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", url, "--json"], env=environment,
                          capture_output=True, text=True, timeout=600)
    assert scan.returncode == 0, scan.stderr
    printed = json.loads(scan.stdout)["findings"]
    assert any(f["node"] and f["training_step"] == 5 for f in printed), printed
    keys = open_location(url).list_files()
    table_key = "findings/trial=t1/rank=0/findings.parquet"
    assert table_key in keys and any(k.startswith("trials/t1/analysis/findings-") for k in keys), sorted(keys)
    location = open_location(url)
    dataset = ds.dataset([location.key(table_key)], filesystem=location.filesystem, format="parquet")  # noqa: F841
    with duckdb.connect() as con:
        stored = con.execute("SELECT detector, node, training_step FROM dataset ORDER BY ALL").fetchall()
    assert stored == sorted((f["detector"], f["node"], f["training_step"]) for f in printed)
    # The second machine: a mirror of its own, filled from the bucket alone.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine2"))
    group = GroupReader(url)
    assert str(tmp_path / "machine2") in str(group.path)
    trial = group.trial("t1")
    kept = saved.load(trial, trial_signature(trial), ScanOptions())
    assert kept is not None and len(kept[0]) == len(printed)
    assert pq.read_table(group.path / table_key).num_rows == len(printed)
    # A later refresh of the first machine's mirror keeps them (they are in the bucket now, at the bucket's time).
    again = subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", url, "--json"], env=environment,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and json.loads(again.stdout)["findings"] == printed, again.stderr


def test_a_recorders_uploader_walks_its_own_trial_after_its_first_pass(s3_env: str, tmp_path: Path) -> None:
    """The first pass sends everything the spool holds (what earlier runs left); later passes walk only the trial's
    folders, so a pass of the thousandth trial of a sweep costs what the first one did, and deletes nothing of the
    other trials."""
    local = tmp_path / "group"
    mine = [local / "trials" / "a" / "trial.json", local / "tensors" / "trial=a" / "rank=0" / "c0.parquet"]
    other = local / "tensors" / "trial=b" / "rank=0" / "c0.parquet"
    for path in [*mine, other]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 10)
    location = open_location(f"{s3_env}/g")
    walked: list[list[str]] = []

    def scope() -> list[str]:
        walked.append(["trials/a", "tensors/trial=a"])
        return walked[-1]

    uploader = Uploader(local, location, journal_root=tmp_path, scope=scope)
    assert uploader.run_pass().uploaded == 3 and walked == []  # the first pass: the whole folder
    late = local / "tensors" / "trial=b" / "rank=0" / "c1.parquet"  # another trial's writer, another uploader
    late.write_bytes(b"y")
    merged = local / "tensors" / "trial=a" / "rank=0" / "c1.parquet"
    merged.write_bytes(b"m" * 20)
    mine[1].unlink()  # merged away
    other.unlink()  # gone from another trial's folder: not this uploader's to delete
    result = uploader.run_pass()
    assert (result.uploaded, result.deleted) == (1, 1) and len(walked) == 1
    assert sorted(location.list_files()) == ["tensors/trial=a/rank=0/c1.parquet", "tensors/trial=b/rank=0/c0.parquet",
                                             "trials/a/trial.json"]
    # comgra sync (no scope) walks everything: the other trial's new file goes up, its merged-away part goes.
    result = Uploader(local, location, journal_root=tmp_path).run_pass()
    assert (result.uploaded, result.deleted) == (1, 1)
