"""A step in the index always has its data: after a power loss, and after a kill at any moment of finalize.

The steps chunk is a step's commit record. The writer fsyncs a flush's files at once (fewer waits on the
disk), so the order that makes this true is checked here, not assumed:
  * power loss: replaying the writer's fsyncs and renames, a steps chunk is renamed only once every file of
    its flush (graph, tensors, KPIs, notes) is durable under its final name, i.e. its bytes were fsynced
    before its rename and its folder after it. A rename that is not yet durable may or may not survive a
    power loss, so a steps rename before that point could survive while the data's did not.
  * SIGKILL during ``close`` (what ``finalize`` waits for), held before each of its fsyncs and renames in turn:
    comgra's reader and plain DuckDB find every indexed step's graph and rows.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from comgra.store import GroupReader
from comgra.store import format as fmt
from comgra.store.repair import repair_group
from comgra.store.writer import ChunkWriter
from comgra.store import layout

STEP_TABLES = textwrap.dedent('''
    import pyarrow as pa
    from comgra.store import format as fmt

    def graph_hash(step):
        return f"{step % 3:016x}"  # three structures, as a graph hash looks

    def step_tables(step):
        """A step as the recorder hands it over: its graph, tensor rows, a KPI point, a note, its steps row."""
        tensors = pa.Table.from_pylist(
            [{"training_step": step, "kind": fmt.FORWARD, "iteration": 0, "node": node, "role": "out",
              "tensor_name": node, "tensor_type": "calculated", "aggregation": "none", "sample": -1,
              "category": "", "shape": [3], "mean": float(step), "num_neurons": 3, "neurons": [1.0, 2.0, 3.0]}
             for node in ("x", "y")], schema=fmt.TENSORS_SCHEMA)
        kpis = pa.Table.from_pylist([{"kpi_group": "loss", "kpi_name": "", "type_of_execution": "main",
                                      "timepoint": step, "value": 1.0}], schema=fmt.KPIS_SCHEMA)
        notes = pa.Table.from_pylist([{"seq": step, "wall_time": 0.0, "note": f"step {step}"}], schema=fmt.NOTES_SCHEMA)
        steps = pa.Table.from_pylist([{"training_step": step, "type_of_execution": "main", "iteration": 0,
                                       "graph": graph_hash(step), "batch_size": 1, "kinds": [fmt.FORWARD],
                                       "samples": [], "categories": None, "wall_time": 0.0}], schema=fmt.STEPS_SCHEMA)
        graph = {"format_version": fmt.FORMAT_VERSION, "hash": graph_hash(step), "edges": [],
                 "nodes": [{"id": n, "node": n, "role": "out", "roles": ["out"], "column": 0, "row": 0}
                           for n in ("x", "y")]}
        return [("json", f"graphs/{graph_hash(step)}.json", graph), ("table", "tensors", tensors), ("table", "kpis", kpis),
                ("table", "notes", notes), ("table", "steps", steps)]

    def put_step(writer, step):
        for kind, name, payload in step_tables(step):
            (writer.put_json if kind == "json" else writer.put_table)(name, payload)
''')
exec(STEP_TABLES)  # noqa: S102 - the same step tables in this process and in the killed ones


class _Disk:
    """The writer's fsyncs and renames, in order, as a power-loss model reads them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def fsync(self, path: Path, flags: int) -> None:
        with self.lock:
            self.events.append(("fsync", str(path), ""))

    def replace(self, original, source: os.PathLike, target: os.PathLike) -> None:
        with self.lock:
            self.events.append(("rename", str(source), str(target)))
        original(source, target)


def _check_power_loss_order(events: list[tuple[str, str, str]]) -> int:
    """At each steps chunk's rename, every file renamed before it and every chunk of its flush (the same sequence
    number in its name) is durable. Returns how many steps chunks of flushes (not merges) it saw."""
    flush_of = {target: chunk.seq for kind, _, target in events
                if kind == "rename" and (chunk := fmt.parse_chunk_name(Path(target).name)) and chunk.level == 0}
    synced: set[str] = set()  # files whose bytes are durable
    renamed: dict[str, int] = {}  # final path -> index of its rename
    durable: set[str] = set()
    commits = 0
    for index, (kind, path, target) in enumerate(events):
        if kind == "fsync":
            synced.add(path)
            durable |= {p for p, at in renamed.items() if str(Path(p).parent) == path and at < index}
            continue
        assert path in synced, f"{Path(target).name} was renamed into place before its bytes were fsynced"
        if "/steps/" in target and target in flush_of:
            its_flush = {p for p, seq in flush_of.items() if seq == flush_of[target] and p != target}
            missing = sorted(Path(p).name for p in (set(renamed) | its_flush) - durable)
            assert not missing, f"steps chunk {Path(target).name} renamed while {missing} could still vanish"
            commits += 1
        renamed[target] = index
    last_steps = [i for i, (kind, _, target) in enumerate(events) if kind == "rename" and "/steps/" in target]
    assert last_steps and any(kind == "fsync" and ("/steps/" in path or path.endswith("/steps")) for kind, path, _ in events[last_steps[-1]:])
    return commits


def test_a_steps_chunk_is_renamed_only_once_its_data_is_durable(tmp_path: Path, monkeypatch) -> None:
    disk = _Disk()
    monkeypatch.setattr(fmt, "DURABLE_WRITES", True)
    monkeypatch.setattr(fmt, "_fsync", disk.fsync)
    original = os.replace
    monkeypatch.setattr(os, "replace", lambda source, target: disk.replace(original, source, target))
    writer = ChunkWriter(tmp_path / "trial", flush_seconds=1000, merge_every=2, compact_at_close=False)
    for step in range(7):
        put_step(writer, step)
        if step % 2:
            writer.flush()
    writer.close()  # finalize's write
    assert writer.error is None
    assert _check_power_loss_order(disk.events) == 4  # three flushes and the close


def test_the_power_loss_model_catches_a_steps_chunk_renamed_too_early() -> None:
    """The check above can fail: a tensors chunk whose folder was not fsynced before the steps rename."""
    tensors, steps = f"/t/tensors/{fmt.chunk_name(4, 0, 1)}", f"/t/steps/{fmt.chunk_name(4, 0, 1)}"
    synced = [("fsync", "/t/tensors/.tmp-a", ""), ("fsync", "/t/steps/.tmp-b", "")]
    good = [*synced, ("rename", "/t/tensors/.tmp-a", tensors), ("fsync", "/t/tensors", ""),
            ("rename", "/t/steps/.tmp-b", steps), ("fsync", "/t/steps", "")]
    assert _check_power_loss_order(good) == 1
    folder_after_steps = [*synced, good[2], good[4], good[3], good[5]]
    steps_first = [*synced, good[4], good[2], good[3], good[5]]
    for events in (folder_after_steps, steps_first):
        with pytest.raises(AssertionError, match="could still vanish"):
            _check_power_loss_order(events)
    with pytest.raises(AssertionError, match="before its bytes were fsynced"):
        _check_power_loss_order([good[0], *good[2:]])


KILLED_RUN = STEP_TABLES + textwrap.dedent('''
    import os, sys, threading, time
    from pathlib import Path
    import comgra.store.format as fmt
    from comgra.store.writer import ChunkWriter

    trial, hold_at = Path(sys.argv[1]), int(sys.argv[2])
    fmt.write_json_atomic(trial / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION, "trial_id": "trial"})
    writer = ChunkWriter(trial, flush_seconds=1000, compact_at_close=False)
    for step in range(6):
        put_step(writer, step)
        if step == 2:
            writer.flush()  # steps 0-2 on disk before finalize; 3-5 are written by it
    fsync, rename, count, lock = fmt._fsync, os.replace, [0], threading.Lock()

    def hold():  # before the hold_at-th fsync or rename of close; called on several threads at once
        with lock:
            held = count[0] == hold_at
            count[0] += 1
            if held:
                print("HELD", flush=True)
        if held:
            time.sleep(60)  # the parent kills us here

    def held_fsync(path, flags):
        hold()
        fsync(path, flags)

    def held_rename(source, target):
        hold()
        rename(source, target)

    fmt.DURABLE_WRITES = True
    fmt._fsync, os.replace = held_fsync, held_rename
    writer.close()
    print("CLOSED", count[0], flush=True)
''')


def _run_until(script: Path, trial: Path, hold_at: int) -> str:
    """Start a run that holds at its ``hold_at``-th fsync or rename of close; kill it there. The line it printed."""
    process = subprocess.Popen([sys.executable, str(script), str(trial), str(hold_at)], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line == "HELD":
        time.sleep(0.05)  # let the other fsyncs of its phase finish: the kill lands mid-phase or just after
        process.kill()
    process.wait(timeout=60)
    process.stdout.close()
    return line


def _check_every_indexed_step_has_its_data(group: Path) -> list[int]:
    trial = GroupReader(group).trial("trial")
    indexed = sorted(trial.steps()["training_step"].to_pylist())
    for step in indexed:
        rows = trial.selection(training_step=step)
        assert sorted(rows["node"].to_pylist()) == ["x", "y"], f"step {step} is indexed but its rows are missing"
        assert trial.graph(graph_hash(step))["nodes"], f"step {step} is indexed but its graph is missing"
    trial_dir = fmt.trial_dir(group, "trial")
    repair_group(group)
    with duckdb.connect() as connection:  # the documented plain route, after repair
        orphans = connection.execute(
            "SELECT count(*) FROM read_parquet(?) s WHERE s.training_step NOT IN "
            "(SELECT training_step FROM read_parquet(?))",
            [str(layout.rank_dir(trial_dir, "steps", 0) / "*.parquet"), str(layout.rank_dir(trial_dir, "tensors", 0) / "*.parquet")]).fetchone()[0]
    assert orphans == 0, "plain DuckDB finds indexed steps without tensor rows"
    return indexed


@pytest.mark.slow
def test_a_kill_at_any_fsync_or_rename_of_finalize_never_indexes_a_step_without_its_data(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(KILLED_RUN)
    first = _run_until(script, tmp_path / "complete" / "trials" / "trial", hold_at=10**6)
    assert first.startswith("CLOSED")
    moments = int(first.split()[1])
    assert moments >= 6, "close made fewer fsyncs and renames than its data, its folders and its steps chunk need"
    assert _check_every_indexed_step_has_its_data(tmp_path / "complete") == list(range(6))
    seen = set()
    for hold_at in range(moments):
        group = tmp_path / f"held{hold_at}"
        assert _run_until(script, group / "trials" / "trial", hold_at) == "HELD"
        indexed = _check_every_indexed_step_has_its_data(group)
        assert indexed[:3] == [0, 1, 2], "a step flushed before finalize was lost"
        seen.add(len(indexed))
    assert seen == {3, 6}, f"the kills never landed both before and after the steps chunk appeared: {seen}"


AT_EXIT = STEP_TABLES + textwrap.dedent('''
    import atexit, sys
    from pathlib import Path
    import comgra.store.format as fmt
    from comgra.store.writer import ChunkWriter

    trial = Path(sys.argv[1])
    fmt.write_json_atomic(trial / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION, "trial_id": "trial"})
    writer = ChunkWriter(trial, flush_seconds=1000, compact_at_close=False)
    for step in range(3):
        put_step(writer, step)
    atexit.register(writer.close)  # as the recorder's finalize at exit, for a script that never calls it
''')


def test_a_writer_closed_at_interpreter_exit_writes_its_last_chunks(tmp_path: Path) -> None:
    """atexit handlers run after Python has stopped thread pools (concurrent.futures refuses new work then)."""
    script = tmp_path / "run.py"
    script.write_text(AT_EXIT)
    group = tmp_path / "group"
    completed = subprocess.run([sys.executable, str(script), str(fmt.trial_dir(group, "trial"))], capture_output=True,
                               text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert _check_every_indexed_step_has_its_data(group) == [0, 1, 2], completed.stderr
