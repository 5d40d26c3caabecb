"""What a recorder leaves on the training node when it records to a bucket: the spool is given back once the
bucket holds everything, and the upload journal stays bounded over a long run."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_object_storage import GROUP, train

from comgra.store import GroupReader, layout
from comgra.store.filesystems import open_location
from comgra.store.uploader import COMPACT_AT_LINES, Journal, Uploader, local_files


def keys(trial: Any) -> list[tuple]:
    return sorted(tuple(row[k] for k in ("training_step", "kind", "iteration", "node", "role", "aggregation", "sample"))
                  for step in range(len(trial.steps())) for row in trial.selection(training_step=step).to_pylist())


def spool_files(recorder) -> dict[str, tuple[int, int]]:
    return local_files(recorder.options.group_dir)


def test_finalize_removes_the_spool_once_the_bucket_holds_everything(s3_env: str, tmp_path: Path) -> None:
    removing = tmp_path / "comgra.toml"
    removing.write_text("[storage]\nupload_timeout_s = 120\n")  # keep_uploaded: its default, false
    reference = train(tmp_path / "local", "t1", steps=9)  # the same run recorded locally: what the bucket must hold
    url = f"{s3_env}/runs"
    recorder = train(url, "t1", steps=9, config=removing)
    group = recorder.options.group_dir
    assert spool_files(recorder) == {}, spool_files(recorder)  # nothing of the trial left on the node
    assert not (group / "trials" / "t1").exists() and not layout.trial_partitions(group, "t1")
    a, b = GroupReader(f"{url}/{GROUP}").trial("t1"), GroupReader(reference.options.group_dir).trial("t1")
    assert a.steps().drop_columns(["wall_time"]).to_pylist() == b.steps().drop_columns(["wall_time"]).to_pylist()
    assert keys(a) == keys(b) and len(keys(a)) > 9  # the values differ: each run draws its own weights
    assert a.problems == []

    # A second trial of the same spool: the first one's objects stay in the bucket (no uploader deletes them).
    train(url, "t2", steps=3, config=removing)
    remote = GroupReader(f"{url}/{GROUP}")
    assert remote.trials() == ["t1", "t2"]
    assert len(remote.trial("t1").steps()) == 9

    # A new run of t1 in the same spool replaces the earlier one in the bucket, as it would in a spool that kept it:
    # no step twice, no object of the first run left.
    train(url, "t1", steps=4, config=removing)
    remote = GroupReader(f"{url}/{GROUP}")
    steps = remote.trial("t1").steps()["training_step"].to_pylist()
    assert sorted(steps) == [0, 1, 2, 3], steps
    assert remote.trial("t1").problems == []


def test_a_spool_with_files_not_uploaded_is_kept(s3_env: str, tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "comgra.toml"
    config.write_text("[storage]\nupload_timeout_s = 1.0\n[storage.options.s3]\nconnect_timeout = 0.5\n"
                      "request_timeout = 0.5\n")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing answers: nothing is confirmed
    with pytest.warns(Warning, match="comgra sync"):
        recorder = train(f"{s3_env}/runs", "t1", steps=3, config=config)
    assert any(key.endswith(".parquet") for key in spool_files(recorder))


def test_the_upload_journal_is_compacted_over_a_long_run(s3_env: str, tmp_path: Path) -> None:
    """A long run's flushes: parts uploaded, merged into one chunk, deleted remotely; the journal is rewritten as
    it grows, no line another process appends meanwhile is lost, and what it says stays true."""
    location = open_location(f"{s3_env}/long/{GROUP}")
    local = tmp_path / "spool" / GROUP
    folder = local / "tensors" / "trial=t" / "rank=0"
    folder.mkdir(parents=True)
    uploader = Uploader(local, location, journal_root=local.parent)
    other = Journal(local.parent, location.url)  # another process of the node, sharing the journal
    most, compacted = 0, False
    for cycle in range(40):
        for part in range(10):
            (folder / f"part-{cycle:03d}-{part}.parquet").write_bytes(b"p" * (part + 1))
        assert not uploader.run_pass().errors
        for part in range(10):
            (folder / f"part-{cycle:03d}-{part}.parquet").unlink()
        (folder / f"merged-{cycle:03d}.parquet").write_bytes(b"m" * cycle)
        other.append("P", f"other/{cycle}.parquet", 1, 1)  # a claim of the other process, between the passes
        assert not uploader.run_pass().errors
        lines = len(uploader.journal.path.read_text().splitlines())
        compacted = compacted or lines < most
        most = max(most, lines)
    assert compacted and most <= COMPACT_AT_LINES + 40, most  # without compaction: 40 cycles x 32 lines
    assert set(location.list_files()) == set(local_files(local))  # merged parts deleted remotely, merged ones up
    fresh = Journal(local.parent, location.url)  # a later run reading the compacted journal
    for journal in (fresh, other, uploader.journal):
        journal.read_new()
        assert {k for k, e in journal.entries.items() if e.op == "U"} == {f"tensors/trial=t/rank=0/{k}" for k in
                                                                          (p.name for p in folder.iterdir())}
        assert {k for k, e in journal.entries.items() if e.op == "P"} >= {f"other/{c}.parquet" for c in range(40)}
    assert Uploader(local, location, journal_root=local.parent).run_pass().uploaded == 0  # nothing sent again


def test_an_upload_the_store_did_not_take_is_not_journaled_as_uploaded(tmp_path: Path, monkeypatch) -> None:
    """A PUT that fails at its end (S3 sends the object when the stream closes) is an error, not an upload: the file
    stays pending (pyarrow.fs.copy_files dropped that error, and a run on a dead endpoint 'uploaded' everything)."""
    for name, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "test",
                        "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    local = tmp_path / GROUP
    (local / "trials" / "t").mkdir(parents=True)
    (local / "trials" / "t" / "trial.json").write_text("{}")
    uploader = Uploader(local, open_location("s3://bucket/runs", {"connect_timeout": 0.5, "request_timeout": 0.5}),
                        journal_root=tmp_path, max_attempts=1)
    result = uploader.run_pass()
    assert result.uploaded == 0 and result.pending == 1 and result.errors, result
    assert all(entry.op != "U" for entry in uploader.journal.entries.values())


def test_each_rank_gives_back_its_own_folders_and_the_last_the_trials(s3_env: str, tmp_path: Path) -> None:
    from comgra.store.spool import remove_uploaded

    local = tmp_path / "spool" / GROUP
    for rank in (0, 1):
        for table in ("tensors", "steps"):
            folder = layout.partition_dir(local, table, "t", rank)
            folder.mkdir(parents=True)
            (folder / f"000000000000-000000000009-r{rank:03d}-000000.parquet").write_bytes(b"x" * (rank + 3))
    (local / "trials" / "t").mkdir(parents=True)
    (local / "trials" / "t" / "trial.json").write_text("{}")
    location = open_location(f"{s3_env}/ranks/{GROUP}")
    uploader = Uploader(local, location, journal_root=local.parent)
    assert uploader.run_pass().uploaded == 5
    late = layout.partition_dir(local, "tensors", "t", 1) / "000000000010-000000000019-r001-000001.parquet"
    late.write_bytes(b"late")  # rank 1 wrote a chunk that is not uploaded yet

    assert remove_uploaded(uploader, "t", 0) == 2 * 3
    assert not layout.partition_dir(local, "tensors", "t", 0).exists()
    assert (local / "trials" / "t" / "trial.json").exists()  # rank 1 is still there
    assert remove_uploaded(uploader, "t", 1) == 0  # its late chunk is not in the bucket: nothing removed
    assert late.exists()
    uploader.run_pass()
    assert remove_uploaded(uploader, "t", 1) > 0
    assert local_files(local) == {} and not (local / "trials" / "t").exists()
    assert not layout.trial_partitions(local, "t")
    assert len(location.list_files()) == 6  # nothing deleted in the store
    assert uploader.run_pass().deleted == 0
    assert len(location.list_files()) == 6


def test_earlier_runs_moved_aside_in_the_spool_go_to_the_bucket_and_leave_the_node(
        s3_env: str, tmp_path: Path) -> None:
    """A run whose upload failed leaves its files in the spool; the next run of the trial moves them aside
    (GROUP/.replaced/, as on local disk). Its finalize sends them to GROUP/.replaced/<name>/ in the bucket and
    removes them from the node; a folder another living process moved aside is left to it; readers never see them."""
    from comgra.store.remote import mirror_base
    from comgra.store.spool import recording_root

    removing, dead = tmp_path / "removing.toml", tmp_path / "dead.toml"
    removing.write_text("[storage]\nupload_timeout_s = 120\n")
    dead.write_text("[storage]\nupload_timeout_s = 1.0\n[storage.options.s3]\nconnect_timeout = 0.5\n"
                    "request_timeout = 0.5\n")
    url = f"{s3_env}/runs"
    # The first run: a script run before, against an endpoint where nothing answers (its files stay in the spool).
    script = f"from test_object_storage import train; train({url!r}, 't1', steps=5, config={str(dead)!r})"
    environment = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                   "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-W", "default", "-c", script], env=environment, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "comgra sync" in run.stderr, run.stderr[-3000:]
    group = recording_root(url).local / GROUP
    earlier = sorted((key.rsplit("/", 1)[-1], size) for key, (size, _) in local_files(group).items())
    assert any(name.endswith(".parquet") for name, _ in earlier)
    busy = group / ".replaced" / f"t1-20260101-000000-{os.getppid()}"  # a mover that still lives: left alone
    busy.mkdir(parents=True)
    (busy / "trial.json").write_text("{}")

    train(url, "t1", steps=4, config=removing)

    assert sorted(p.name for p in (group / ".replaced").iterdir()) == [busy.name]
    objects = open_location(f"{url}/{GROUP}").list_files()
    names = {key.split("/")[1] for key in objects if key.startswith(".replaced/")}
    assert len(names) == 1 and busy.name not in names, names
    sent = sorted((key.rsplit("/", 1)[-1], size) for key, (size, _) in objects.items() if key.startswith(".replaced/"))
    assert sent == earlier  # every file of the earlier run, at its size
    remote = GroupReader(f"{url}/{GROUP}")
    assert remote.trials() == ["t1"] and sorted(remote.trial("t1").steps()["training_step"].to_pylist()) == [0, 1, 2, 3]
    assert not [p for p in mirror_base().rglob("*") if ".replaced" in p.parts]  # the mirror never fetches them


def test_fresh_chunks_go_up_once_their_delay_is_over_and_finish_sends_everything(s3_env: str, tmp_path: Path) -> None:
    """While the training runs, a chunk as the writer first writes it waits ``delay`` seconds (a merge replaces most
    before), the steps chunk no earlier than its data; merged chunks and documents go at once; finish waits for
    nothing."""
    from comgra.store import format as fmt

    local = tmp_path / "group"
    fresh = layout.partition_dir(local, "tensors", "t", 0) / fmt.chunk_name(2, 0, 9)
    merged = layout.partition_dir(local, "tensors", "t", 0) / fmt.chunk_name(1, 0, 4, level=1)
    steps = layout.partition_dir(local, "steps", "t", 0) / fmt.chunk_name(3, 0, 9)
    document = local / "trials" / "t" / "trial.json"
    for path in (fresh, merged, steps, document):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 10)
    written = time.monotonic()
    location = open_location(f"{s3_env}/delay/{GROUP}")
    key = {path: path.relative_to(local).as_posix() for path in (fresh, merged, steps, document)}
    uploader = Uploader(local, location, journal_root=tmp_path, interval=0.05, delay=3.0).start()
    def journaled() -> set[str]:  # an object is in the bucket a moment before its upload's journal line
        return {line.rsplit("\t", 1)[-1] for line in uploader.journal.path.read_text().splitlines() if line.startswith("U")}

    while not (set(location.list_files()) == set(key.values()) <= journaled()) and time.monotonic() < written + 30:
        time.sleep(0.05)  # no wake from a writer: the thread's own timer sends the fresh ones once they are due
    objects = location.list_files()
    assert set(objects) == set(key.values())
    for path in (fresh, steps):  # sent no earlier than 3 s after they were written (the store's clock: whole seconds)
        assert objects[key[path]][1] >= path.stat().st_mtime_ns + 2e9, (path.name, objects)
    lines = uploader.journal.path.read_text().splitlines()
    assert max(i for i, line in enumerate(lines) if line.startswith("U") and line.endswith(key[fresh])) < \
        min(i for i, line in enumerate(lines) if line.startswith("U") and line.endswith(key[steps]))
    assert not uploader.finish(30).pending

    later = layout.partition_dir(local, "tensors", "t", 0) / fmt.chunk_name(4, 10, 19)
    later.write_bytes(b"y" * 10)
    waiting = Uploader(local, location, journal_root=tmp_path, delay=3600.0).start()
    result = waiting.finish(30)  # finalize: everything at once, the delay notwithstanding
    assert not result.pending and later.relative_to(local).as_posix() in location.list_files()


def _claim_after_the_others(folder: str, url: str, items: list[tuple[str, int, int]], ready: Any, done: Any,
                            out: Any) -> None:
    """A process of the node: claims ``items`` in the journal at the same moment as the others (a barrier)."""
    journal = Journal(Path(folder), url)
    ready.wait()
    mine = journal.claim(items, lambda key, size, mtime: (
        (entry := journal.entries.get(key)) is not None and entry.pid != os.getpid() and entry.op == "P"))
    out.put([key for key, _, _ in mine])
    done.wait()  # alive until every process has claimed (a dead process's claims are taken again by design)


def test_uploaders_starting_together_never_claim_one_file_twice(tmp_path: Path) -> None:
    """Two ``comgra sync`` of one spool once sent 15 files for 8: each read the journal before the other's claims were
    in it. Reading, choosing and claiming are one step under the journal's lock: four processes claiming 300 files at
    the same moment claim each exactly once."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    items = [(f"tensors/trial=t/chunk-{i:04d}.parquet", 1000 + i, 17) for i in range(300)]
    ready, done, out = context.Barrier(4), context.Barrier(4), context.Queue()
    processes = [context.Process(target=_claim_after_the_others,
                                 args=(str(tmp_path), "s3://bucket/runs", items, ready, done, out)) for _ in range(4)]
    for process in processes:
        process.start()
    claimed = [out.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert all(process.exitcode == 0 for process in processes)
    everything = [key for keys in claimed for key in keys]
    assert sorted(everything) == sorted(key for key, _, _ in items)  # each once, none left out
