"""SIGKILL a recording run at many moments, also inside a chunk write and inside a compaction.

After each kill the recording is checked with comgra's reader (before repair), and with plain
DuckDB over the documented globs and with pyarrow after ``repair`` (as the README says): every
flushed step readable, no temporary file matched by a glob, no row twice, no row missing.

Starting Python with torch costs seconds, so one "zygote" process imports torch once and forks
a fresh training run for every kill.
"""
from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store.repair import repair_group
from comgra.store import layout

pytest.importorskip("torch")

ZYGOTE = textwrap.dedent('''
    import functools, os, signal, sys, time
    import torch
    torch.set_num_threads(1)
    import comgra.capture.session as session
    import comgra.store.format as fmt
    import comgra.store.writer as writer
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder

    def mark(what):
        sys.stdout.write(f"MARK {os.getpid()} {what}\\n")
        sys.stdout.flush()

    def hold(what):  # a slow disk, simulated here only: the parent kills us while we wait
        mark(what)
        time.sleep(30)

    def patch(mode):
        session.ChunkWriter = functools.partial(writer.ChunkWriter, merge_every=2)  # compaction every few flushes
        if mode in ("chunk_write", "merge_write"):
            fsync, writes = fmt._fsync, [0]
            def slow_fsync(path, flags):
                merged = "-l" in path.name
                if fmt.is_temporary(path.name) and path.name.endswith(".parquet.partial") and merged == (mode == "merge_write"):
                    writes[0] += 1
                    if writes[0] >= 6:  # after a few chunks are in place
                        hold(mode)
                fsync(path, flags)
            fmt._fsync = slow_fsync
        if mode == "merge_renamed":
            write_chunk = writer._write_chunk
            def slow_after_rename(name, path, table):
                write_chunk(name, path, table)
                if "-l" in path.name:
                    hold(mode)  # the merged chunk is in place, its parts are not deleted yet
            writer._write_chunk = slow_after_rename

    def train(root, mode):
        patch(mode)
        torch.manual_seed(0)
        recorder = ComgraRecorder(root, "group", "trial",
                                  DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=1),
                                  flush_seconds=0.01)
        model = torch.nn.Linear(3, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        recorder.track_module("model", model)
        mark("started")
        step = 0
        while True:  # until killed
            recorder.start_batch(step, 4)
            recorder.start_iteration()
            x = torch.randn(4, 3)
            recorder.register_tensor("x", x, is_input=True)
            y = model(x)
            recorder.register_tensor("y", y)
            loss = y.pow(2).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            recorder.record_kpi_in_graph("loss", "", loss, record_even_if_recording_is_inactive=True)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            recorder.add_note(f"step {step}")
            recorder.finish_batch()
            step += 1

    def warm_up():  # lazy imports (the optimizer pulls in torch._dynamo) happen once, before any fork
        model = torch.nn.Linear(3, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()
        import comgra.capture.step, comgra.capture.stats, pyarrow.compute, pyarrow.parquet

    warm_up()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed runs are reaped at once
    sys.stdout.write("READY\\n"); sys.stdout.flush()
    for line in sys.stdin:
        root, mode = line.split()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                train(root, mode)
            finally:
                os._exit(1)
        sys.stdout.write(f"PID {pid}\\n"); sys.stdout.flush()
''')


class Zygote:
    def __init__(self, directory: Path):
        script = directory / "zygote.py"
        script.write_text(ZYGOTE)
        self.process = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._next(lambda line: line == "READY", 60)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def _next(self, wanted, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if wanted(line):
                return line
        return None

    def start(self, root: Path, mode: str) -> int:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{root} {mode}\n")
        self.process.stdin.flush()
        line = self._next(lambda line: line.startswith("PID "), 30)
        assert line, "the zygote forked no run"
        return int(line.split()[1])

    def wait_for(self, pid: int, what: str, timeout: float) -> bool:
        return self._next(lambda line: line == f"MARK {pid} {what}", timeout) is not None

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.005)
    raise AssertionError(f"run {pid} survived SIGKILL")


KEYS = {"steps": "training_step, iteration", "kpis": "timepoint", "notes": "seq",
        "tensors": "training_step, kind, iteration, node, role, aggregation, sample",
        "runinfo": "training_step, subject, name, field", "sentinels": "training_step, name"}


def _plain_duckdb(trial_dir: Path, table: str) -> tuple[int, int]:
    """Rows and distinct keys of the documented glob, read as a user would."""
    glob = str(layout.rank_dir(trial_dir, table, 0) / "*.parquet")
    with duckdb.connect() as connection:
        return connection.execute(f"SELECT count(*), count(DISTINCT ({KEYS[table]})) FROM read_parquet(?)",
                                  [glob]).fetchone()


def _check_with_comgra(group: Path) -> dict[str, int]:
    trial = GroupReader(group).trial("trial")
    steps = trial.steps()
    recorded = sorted(steps["training_step"].to_pylist())
    assert recorded == list(range(len(recorded))), "a flushed step is missing or indexed twice"
    for step in {0, len(recorded) // 2, len(recorded) - 1} if recorded else ():
        rows = trial.selection(training_step=step)
        keys = set(zip(*(rows[c].to_pylist() for c in ("kind", "iteration", "node", "role", "aggregation", "sample"))))
        assert rows.num_rows > 0 and len(keys) == rows.num_rows, f"step {step}: rows missing or twice"
    kpis = trial.kpis()["timepoint"].to_pylist()
    assert len(kpis) == len(set(kpis)), "a KPI point read twice"
    return {"steps": len(recorded), "kpis": len(kpis)}


def _check_plain_readers(trial_dir: Path, expected: dict[str, int]) -> None:
    for table in fmt.TABLES:
        folder = layout.rank_dir(trial_dir, table, 0)
        if not any(folder.glob("*.parquet")):
            continue
        rows, keys = _plain_duckdb(trial_dir, table)
        assert rows == keys, f"{table}: plain DuckDB counts {rows - keys} rows twice"
        assert ds.dataset(folder, format="parquet").count_rows() == rows, table
        assert pq.read_table(folder).num_rows == rows, table
        if table in expected:
            assert rows >= expected[table], f"{table}: plain readers miss rows comgra's reader sees"


def _leftovers(trial_dir: Path) -> list[str]:
    folders = [trial_dir, *layout.trial_partitions(layout.group_of(trial_dir), trial_dir.name)]
    return [str(p) for folder in folders for p in folder.rglob(f"{fmt.TEMP_PREFIX}*")]


@pytest.mark.slow
def test_sigkill_at_random_moments_and_inside_writes_and_compactions(tmp_path: Path) -> None:
    zygote = Zygote(tmp_path)
    randomness = random.Random(6)
    plan = ["chunk_write", "merge_write", "merge_renamed"] * 2 + ["random"] * 6
    seen = {"temporary": 0, "covered": 0}
    try:
        for run, mode in enumerate(plan):
            root = tmp_path / f"run{run}"
            pid = zygote.start(root, mode)
            assert zygote.wait_for(pid, "started", 30), "the run did not start"
            if mode == "random":
                time.sleep(randomness.uniform(0.2, 1.2))
            else:
                assert zygote.wait_for(pid, mode, 20), f"the run never reached {mode}"
            _kill(pid)
            group = root / "group"
            trial_dir = fmt.trial_dir(group, "trial")
            for table in fmt.TABLES:  # the documented globs never match a file being written
                assert not [p for p in (layout.rank_dir(trial_dir, table, 0)).glob("*.parquet") if fmt.is_temporary(p.name)]
            expected = _check_with_comgra(group)
            before = _leftovers(trial_dir)
            if mode in ("chunk_write", "merge_write"):
                assert before, "the kill inside a write left no temporary file: the test missed its moment"
            (report,) = repair_group(group)
            assert not report.skipped_live, "the killed run's lock was not released"
            # Temporary names are unique (pid, random hex); format 3 reports them relative to the group's tables.
            assert sorted(Path(p).name for p in report.temporary_removed) == sorted(Path(b).name for b in before)
            if mode == "merge_renamed":
                assert report.covered_removed, "the kill after the merge left no parts: the test missed its moment"
            seen["temporary"] += len(report.temporary_removed)
            seen["covered"] += len(report.covered_removed)
            assert not _leftovers(trial_dir)
            _check_plain_readers(trial_dir, expected)
            assert _check_with_comgra(group) == expected, "repair changed what comgra's reader sees"
    finally:
        zygote.close()
    assert seen["temporary"] >= 4 and seen["covered"] >= 2, seen
