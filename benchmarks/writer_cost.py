"""The writer's cost per recorded step: CPU of the writer thread and the time ``finalize`` waits.

A recorded step hands its tables to the writer thread, which buffers them (at most 1 MiB of Arrow data)
and then writes one Parquet chunk per table, fsyncs it and renames it into place, and merges chunks. On
a machine with few cores that CPU is taken from training, so it is part of a recorded step's cost.

This script records a few ResNet-18-shaped steps once (every step recorded), keeps the tables the
recorder handed to its writer, and then replays them, with shifted step numbers, into a fresh writer
of each version in turn (interleaved rounds, so drift hits both alike):

    python benchmarks/writer_cost.py --rounds 8 [--steps 60] [--before REV]

``--before REV`` also loads ``src/comgra/store/writer.py`` of git revision REV (default HEAD) and prints
both side by side. Per recorded step: the CPU of all threads while the writer works (process CPU less
the feeding thread's), the writer thread's own CPU, and the wall time of ``close`` (what ``finalize``
waits for: the last chunks with their fsyncs). Durable writes (fsync) are on, as in a user's run.
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def capture(workload: str = "resnet18", steps: int = 6) -> list[tuple[str, Any, Any]]:
    """What the recorder hands its writer over ``steps`` recorded steps (after one warm-up step)."""
    sys.path.insert(0, str(HERE))
    import comgra
    import recording_workloads as workloads
    from comgra import objects
    from comgra.store.writer import ChunkWriter

    items: list[tuple[str, Any, Any]] = []
    original_table, original_json = ChunkWriter.put_table, ChunkWriter.put_json

    def put_table(self: Any, name: str, table: Any) -> None:
        items.append(("table", name, table))
        original_table(self, name, table)

    def put_json(self: Any, relative_path: str, document: Any) -> None:
        items.append(("json", relative_path, document))
        original_json(self, relative_path, document)

    model, optimizer, step_function = workloads.prepare(workload)
    with tempfile.TemporaryDirectory() as folder:
        recorder = workloads.make_recorder(comgra, objects, "all", Path(folder), "capture", 1)
        comgra.my_recorder = recorder
        recorder.track_module("main_model", model)
        step_function(recorder, model, optimizer, 0)
        ChunkWriter.put_table, ChunkWriter.put_json = put_table, put_json
        try:
            for step in range(1, steps + 1):
                step_function(recorder, model, optimizer, step)
            recorder.finalize()
        finally:
            ChunkWriter.put_table, ChunkWriter.put_json = original_table, original_json
    return items


def load_writer_of(revision: str) -> Any:
    """``comgra.store.writer`` as it was at a git revision, as a module of its own."""
    source = subprocess.run(["git", "show", f"{revision}:src/comgra/store/writer.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"writer_{revision.replace('/', '_')}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def shifted(table: Any, offset: int) -> Any:
    """The table with its step numbers moved on by ``offset``: a replayed step is a new step."""
    import pyarrow.compute as pc
    for column in ("training_step", "timepoint"):
        if column in table.column_names:
            index = table.column_names.index(column)
            table = table.set_column(index, table.field(index), pc.add(table[column], offset))
    return table


def per_step(items: list[tuple[str, Any, Any]]) -> tuple[list[tuple[str, Any, Any]], list[list[tuple[str, Any]]]]:
    """The JSON documents, and the tables of each recorded step (a step ends with its steps row)."""
    documents = [item for item in items if item[0] == "json"]
    steps: list[list[tuple[str, Any]]] = [[]]
    for kind, name, payload in items:
        if kind == "table":
            steps[-1].append((name, payload))
            if name == "steps":
                steps.append([])
    return documents, [tables for tables in steps if any(name == "steps" for name, _ in tables)]


def distinct_steps(items: list[tuple[str, Any, Any]], steps: int, seed: int = 0) -> list[list[tuple[str, Any]]]:
    """``steps`` recorded steps made from the captured ones, each with its own step number and values.

    Replaying the same values would flatter the compression of merged chunks (zstd finds the repeats)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    generator = np.random.default_rng(seed)
    _, recorded = per_step(items)

    def jittered(column: Any) -> Any:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_floating(column.type):
            return pc.multiply(column, pa.array(generator.uniform(0.5, 1.5, len(column)).astype(np.float32)))
        if pa.types.is_list(column.type) and pa.types.is_floating(column.type.value_type):
            return pa.ListArray.from_arrays(column.offsets, jittered(column.values), mask=column.is_null())
        return column

    made = []
    for step in range(steps):
        tables = []
        for name, table in recorded[step % len(recorded)]:
            table = shifted(table, step * 10)
            if name == "tensors":
                table = pa.table([jittered(table[c]) if c not in ("training_step", "iteration") else table[c]
                                  for c in table.column_names], schema=table.schema)
            tables.append((name, table))
        made.append(tables)
    return made


def replay(module: Any, items: list[tuple[str, Any, Any]], recorded: list[list[tuple[str, Any]]],
           last: int = 2) -> dict[str, float]:
    """Feed the ``recorded`` steps to a fresh ChunkWriter of ``module``, all but the ``last`` ones, wait for it to
    write them, then the last ones and close it (what finalize waits for); per recorded step figures."""
    documents, _ = per_step(items)
    steps = len(recorded)
    writer_cpu: list[float] = []
    original_run = module.ChunkWriter._run

    def timed_run(self: Any) -> None:
        try:
            original_run(self)
        finally:
            writer_cpu.append(time.thread_time())

    def put(writer: Any, step: int) -> None:
        for name, table in recorded[step]:
            writer.put_table(name, table)

    module.ChunkWriter._run = timed_run
    folder = Path(tempfile.mkdtemp(prefix="writer-cost-"))
    try:
        cpu, main = time.process_time(), time.thread_time()
        writer = module.ChunkWriter(folder / "trial")
        for _, relative_path, document in documents:
            writer.put_json(relative_path, document)
        for step in range(steps - last):
            put(writer, step)
        writer.flush()
        closing = time.perf_counter()
        for step in range(steps - last, steps):
            put(writer, step)
        for _, relative_path, document in documents:  # finalize rewrites the trial's metadata
            writer.put_json(relative_path, document)
        writer.close()
        close_wall = time.perf_counter() - closing
        all_cpu = time.process_time() - cpu - (time.thread_time() - main)  # less the thread that feeds it
        assert writer.error is None, writer.error
        files = sum(1 for _ in (folder / "trial").rglob("*.parquet"))
        size = sum(p.stat().st_size for p in (folder / "trial").rglob("*.parquet"))
    finally:
        module.ChunkWriter._run = original_run
        shutil.rmtree(folder, ignore_errors=True)
    return {"cpu_ms": 1e3 * all_cpu / steps, "writer_ms": 1e3 * writer_cpu[0] / steps, "close_ms": 1e3 * close_wall,
            "files": files, "kib_per_step": size / 1024 / steps}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=100, help="recorded steps replayed per round")
    parser.add_argument("--before", default=None, help="a git revision whose writer.py to compare with")
    args = parser.parse_args(argv)
    from comgra.store import writer as current
    items = capture()
    captured = len(per_step(items)[1])
    arrow = sum(p.nbytes for kind, name, p in items if kind == "table") / captured
    print(f"captured {captured} recorded ResNet-18 steps, {arrow / 1024:.0f} KiB of Arrow data each")
    recorded = distinct_steps(items, args.steps)
    versions = {"now": current}
    if args.before:
        versions = {f"before ({args.before})": load_writer_of(args.before), **versions}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
    for round_ in range(args.rounds):
        order = list(versions) if round_ % 2 == 0 else list(reversed(versions))
        for name in order:
            results[name].append(replay(versions[name], items, recorded))
    print(f"\nwriter cost per recorded step, median of {args.rounds} rounds of {args.steps} recorded steps "
          "(min-max in brackets)")
    print(f"{'writer':<22}{'CPU all threads ms':>22}{'writer thread ms':>22}{'close (finalize) ms':>24}"
          f"{'files':>7}{'KiB/step':>10}")
    for name, runs in results.items():
        cells = []
        for field in ("cpu_ms", "writer_ms", "close_ms"):
            values = [r[field] for r in runs]
            cells.append(f"{statistics.median(values):7.2f} [{min(values):.2f}-{max(values):.2f}]")
        print(f"{name:<22}{cells[0]:>22}{cells[1]:>22}{cells[2]:>24}{runs[-1]['files']:>7.0f}"
              f"{runs[-1]['kib_per_step']:>10.1f}")
    if args.before:
        before, now = (statistics.median(r["cpu_ms"] for r in results[n]) for n in versions)
        print(f"\nnow / before, CPU per recorded step: {now / before:.2f}x")
        before, now = (statistics.median(r["close_ms"] for r in results[n]) for n in versions)
        print(f"now / before, close (finalize): {now / before:.2f}x")
    print(f"(threads alive: {threading.active_count()})")


if __name__ == "__main__":
    main()
