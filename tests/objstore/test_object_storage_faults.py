"""Object storage under faults: a proxy between comgra and the S3 server drops connections, answers 503 SlowDown,
stalls, and loses the answer to a PUT it stored; and uploads SIGKILLed at random moments. Training finishes,
nothing flushed is lost, no row appears twice to comgra's reader or to DuckDB over the bucket.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from s3_faults import Faults, FaultyProxy
from test_object_storage import GROUP, assert_same_recording, plain_tensor_rows, train

from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store.filesystems import open_location
from comgra.store.uploader import local_files


def test_training_finishes_and_loses_nothing_through_a_faulty_network(s3_env: str, s3_server: str, tmp_path: Path,
                                                                       monkeypatch) -> None:
    faults = Faults(drop=0.06, slow_down=0.08, stall=0.05, stall_seconds=1.5, put_lost_answer=0.08, seed=7)
    proxy = FaultyProxy(s3_server, faults)
    # Every chunk sent while the training runs (no upload_delay_s): the faults meet the uploads of training time,
    # the merged-away parts' deletes among them.
    config = tmp_path / "comgra.toml"
    config.write_text("[storage]\nkeep_uploaded = true\nupload_delay_s = 0\n")
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        started = time.monotonic()
        # A ComgraWarning (a lost upload) fails the test.
        recorder = train(f"{s3_env}/runs", "t1", steps=48, pause=0.05, config=config)
        trained = time.monotonic() - started
        # Reading through the same faults: the mirror retries what the filesystem's own retries did not absorb.
        remote = GroupReader(f"{s3_env}/runs/{GROUP}")
        local = GroupReader(recorder.options.group_dir)
        assert_same_recording(remote, local, "t1", 48)
    finally:
        proxy.close()
    assert trained < 120
    assert all(faults.injected[kind] > 0 for kind in ("drop", "slow_down", "stall", "put_lost_answer")), faults
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    url = f"{s3_env}/runs/{GROUP}"
    assert set(open_location(url).list_files()) == set(local_files(recorder.options.group_dir))
    total, distinct = plain_tensor_rows(url, "t1")
    assert total == distinct == sum(len(local.trial("t1").selection(training_step=s)) for s in range(48))


def _merge_two_parts(group: Path, rng: random.Random) -> bool:
    """What the writer's compaction does between two uploads: two chunks of one folder become one, the parts go."""
    from comgra.store.writer import _write_chunk  # sorts as the writer does

    folders: dict[Path, list[Path]] = {}
    for path in sorted(group.rglob("*.parquet")):
        # format 3: GROUP/tensors/trial=<id>/rank=<r>/<chunk>; earlier formats: trials/<id>/tensors/<chunk>
        table = path.parents[2].name if path.parent.name.startswith("rank=") else path.parent.name
        if fmt.parse_chunk_name(path.name) is not None and table == "tensors":
            folders.setdefault(path.parent, []).append(path)
    candidates = [paths for paths in folders.values() if len(paths) >= 2]
    if not candidates:
        return False
    paths = rng.choice(candidates)[:2]
    names = [fmt.parse_chunk_name(p.name) for p in paths]
    seq = max(fmt.seq_of(p.name) for p in paths[0].parent.iterdir() if fmt.is_chunk_name(p.name)) + 1
    merged = paths[0].parent / fmt.chunk_name(seq, min(n.first for n in names), max(n.last for n in names),
                                              names[0].rank, max(n.level for n in names) + 1)
    table = pa.concat_tables([pa.parquet.read_table(p) for p in paths])
    table = table.cast(fmt.SCHEMAS["tensors"] if "rank" in table.schema.names else fmt.FILE_SCHEMAS["tensors"])
    _write_chunk("tensors", merged, table)
    for path in paths:
        path.unlink()
    return True


def _claimed_not_uploaded(journal: Path, pid: int) -> int:
    """1 if the killed process ``pid`` had claimed a file it did not finish uploading (per its journal lines)."""
    state: dict[str, str] = {}
    for path in journal.glob("*.log"):
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) == 6 and fields[3] == str(pid):
                state[fields[5]] = fields[0]
    return int("P" in state.values())


def _first_claim(journal: Path, sync: subprocess.Popen, timeout: float = 60.0) -> bool:
    """Wait until the ``comgra sync`` process ``sync`` has appended its first journal line (it is uploading);
    False if it ended first."""
    mark = f"\t{sync.pid}\t".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and sync.poll() is None:
        if any(mark in path.read_bytes() for path in journal.glob("*.log")):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.slow
def test_twenty_kills_during_uploads_lose_nothing(s3_env: str, s3_server: str, tmp_path: Path,
                                                  monkeypatch) -> None:
    import pyarrow.parquet  # noqa: F401 - pa.parquet in _merge_two_parts

    # Not compacted at finalize: the many per-flush chunks are what the rounds below merge, as a live writer does.
    from comgra.store import writer as chunk_writer

    monkeypatch.setattr(chunk_writer, "COMPACT_AT_CLOSE", False)
    recorder = train(tmp_path / "runs", "t1", steps=30)
    group = recorder.options.group_dir
    steps = 30
    url = f"{s3_env}/runs/{GROUP}"
    proxy = FaultyProxy(s3_server, Faults(stall=0.5, stall_seconds=0.3, seed=3))  # slow, so kills land mid-upload
    rng = random.Random(11)
    environment = {**os.environ, "AWS_ENDPOINT_URL": proxy.url, "PYTHONPATH": os.pathsep.join(sys.path)}
    kills = merges = mid_upload = rounds = 0
    journal = group.parent / ".comgra-upload"
    chunks = sorted(path.name for path in (group / "tensors").rglob("*.parquet"))
    assert len(chunks) >= 4, chunks  # per-flush chunks that the rounds below merge
    try:
        while kills < 20 and rounds < 40:
            # Something to upload in every round: a compaction, or documents rewritten (as a live run rewrites them).
            if not (rng.random() < 0.5 and _merge_two_parts(group, rng)):
                for document in group.rglob("*.json"):
                    os.utime(document)
            else:
                merges += 1
            sync = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "sync", str(group), url],
                                    env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rounds += 1
            # A random moment of the upload itself, not of the interpreter's start: a fixed sleep from the start
            # landed before the first claim on a loaded machine and after the end on an idle one (then the loop ran
            # on and on without a kill).
            if _first_claim(journal, sync):
                time.sleep(rng.uniform(0.0, 0.6))
            if sync.poll() is None:
                sync.send_signal(signal.SIGKILL)
                kills += 1
                sync.wait()
                mid_upload += _claimed_not_uploaded(journal, sync.pid)
            sync.wait()
        proxy.active = False
        done = subprocess.run([sys.executable, "-m", "comgra.cli.app", "sync", str(group), url], env=environment,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        proxy.close()
    # 20 kills, at least 5 of them between a claim and its PUT's end, and a compaction among the rounds.
    assert kills == 20 and merges > 0 and mid_upload >= 5, (kills, merges, mid_upload, rounds)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    # Key for key what the local recording holds: nothing lost, no merged-away part left behind in the bucket.
    assert set(open_location(url).list_files()) == set(local_files(group))
    local = GroupReader(group)
    assert_same_recording(GroupReader(url), local, "t1", steps)
    total, distinct = plain_tensor_rows(url, "t1")
    assert total == distinct == sum(len(local.trial("t1").selection(training_step=s)) for s in range(steps))


def test_two_uploaders_of_one_spool_share_the_work(s3_env: str, s3_server: str, tmp_path: Path,
                                                   monkeypatch) -> None:
    """The ranks of one node (or a sweep's trials) share a spool: two ``comgra sync`` at once finish it together,
    with nothing missing and few files sent twice."""
    recorder = train(tmp_path / "runs", "t1", steps=12)
    group = recorder.options.group_dir
    url = f"{s3_env}/runs/{GROUP}"
    proxy = FaultyProxy(s3_server, Faults(stall=1.0, stall_seconds=0.05, seed=5))  # every request a little slow
    environment = {**os.environ, "AWS_ENDPOINT_URL": proxy.url, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        syncs = [subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "sync", str(group), url],
                                  env=environment, stdout=subprocess.PIPE, text=True) for _ in range(2)]
        outputs = [sync.communicate(timeout=300)[0] for sync in syncs]
    finally:
        proxy.close()
    assert all(sync.returncode == 0 for sync in syncs), outputs
    sent = sum(int(out.split("comgra sync: ")[1].split(" file")[0]) for out in outputs)
    files = local_files(group)
    assert len(files) <= sent <= len(files) * 1.3, outputs
    assert set(open_location(url).list_files()) == set(files)
    assert_same_recording(GroupReader(url), GroupReader(group), "t1", 12)


CRASHING_RUN = '''
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_object_storage import train
import comgra.recorder

finalize = comgra.recorder.ComgraRecorder.finalize
def crash(self):  # the steps are flushed (each third step), then the process dies before finalize
    self.flush()
    os.kill(os.getpid(), signal.SIGKILL)
comgra.recorder.ComgraRecorder.finalize = crash
train({url!r}, "crashed", steps=6)
'''


def test_the_next_run_uploads_what_a_killed_run_left(s3_env: str, s3_server: str, tmp_path: Path,
                                                     monkeypatch) -> None:
    """A run killed while the store was away: its flushed steps are in the node's spool only; the next run into the
    same group (same URL, same spool) uploads them."""
    url = f"{s3_env}/runs"
    environment = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # nothing answers
                   "PYTHONPATH": os.pathsep.join(sys.path)}
    script = CRASHING_RUN.format(tests=str(Path(__file__).parent), url=url)
    crashed = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True,
                             timeout=300)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not open_location(f"{url}/{GROUP}").list_files()  # nothing reached the store
    recorder = train(url, "next", steps=3)  # the store answers again
    remote = GroupReader(f"{url}/{GROUP}")
    assert remote.trials() == ["crashed", "next"]
    assert remote.trial("crashed").steps().num_rows == 6
    assert_same_recording(remote, GroupReader(recorder.options.group_dir), "crashed", 6)
