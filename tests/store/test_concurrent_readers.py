"""Readers while another process writes and compacts: comgra's reader is always exact; plain DuckDB
over the documented globs is measured (it may fail when a chunk vanishes between listing and
reading, or count a merged chunk and its parts twice for a moment), but never reads a temporary file.

The readers go on until enough rounds of queries overlapped a compaction (a merged chunk appeared
or went while the round ran), not for a fixed time: on a loaded machine a round takes longer, and
what the test proves is that reading during compaction is exact, however many rounds fit in a second.

    python tests/store/test_concurrent_readers.py [SECONDS] [MERGE_EVERY]   # prints the plain-reader figures
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pytest

from comgra.store import TrialReader
from comgra.store import format as fmt
from comgra.store import layout

NODES = 4
WRITER = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    import pyarrow as pa
    from comgra.store import format as fmt
    from comgra.store.writer import ChunkWriter

    trial, seconds, merge_every, stop = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    fmt.write_json_atomic(trial / fmt.TRIAL_META, {"format_version": fmt.FORMAT_VERSION, "trial_id": trial.name})
    writer = ChunkWriter(trial, flush_seconds=0.005, max_flush_seconds=0.005, merge_every=merge_every, compact_at_close=False)
    base = {name: None for name in fmt.TENSORS_SCHEMA.names}
    base.update(kind="forward", iteration=0, tensor_type="calculated", aggregation="mean", sample=-1, shape=[1],
                num_neurons=1)
    end, step = time.monotonic() + seconds, 0
    print("STARTED", flush=True)
    while time.monotonic() < end and not stop.exists():
        rows = [dict(base, training_step=step, node=f"n{i}", role=f"n{i}", tensor_name=f"n{i}", mean=float(step))
                for i in range(%d)]
        writer.put_table("tensors", pa.Table.from_pylist(rows, schema=fmt.TENSORS_SCHEMA))
        writer.put_table("steps", pa.Table.from_pylist([dict(training_step=step, type_of_execution="t", iteration=0,
                         graph="g", batch_size=1, kinds=["forward"], samples=[], categories=[], wall_time=0.0)],
                         schema=fmt.STEPS_SCHEMA))
        writer.put_table("kpis", pa.table({"kpi_group": ["loss"], "kpi_name": [""], "type_of_execution": ["t"],
                                           "timepoint": [step], "value": [float(step)]}, schema=fmt.KPIS_SCHEMA))
        step += 1
        time.sleep(0.001)
    writer.close()
    print("STEPS", step, flush=True)
''' % NODES)


@dataclass
class PlainFigures:
    queries: int = 0
    failed: int = 0
    double_counted: int = 0
    errors: set[str] = field(default_factory=set)

    def describe(self) -> str:
        return (f"{self.queries} plain DuckDB queries: {self.failed} failed ({100 * self.failed / max(1, self.queries):.0f}%), "
                f"{self.double_counted} double counted ({100 * self.double_counted / max(1, self.queries):.0f}%)")


def _plain_query(connection: duckdb.DuckDBPyConnection, trial_dir: Path, figures: PlainFigures) -> None:
    figures.queries += 1
    try:
        rows, keys = connection.execute("SELECT count(*), count(DISTINCT (training_step, node)) FROM read_parquet(?)",
                                        [str(layout.rank_dir(trial_dir, "tensors", 0) / "*.parquet")]).fetchone()
    except duckdb.Error as error:
        figures.failed += 1
        figures.errors.add(str(error).splitlines()[0][:160])
        return
    figures.double_counted += rows != keys


def _comgra_queries(reader: TrialReader) -> int:
    """One round of what the app asks; asserts that every answer is exact. Returns the steps indexed."""
    steps = reader.steps()["training_step"].to_pylist()
    assert len(steps) == len(set(steps)), "the step index counts a step twice"
    assert steps == list(range(len(steps))), "the step index misses a step that a later one follows"
    if steps:
        last = steps[-1]
        selection = reader.selection(training_step=last)
        assert sorted(selection["node"].to_pylist()) == [f"n{i}" for i in range(NODES)], f"step {last}"
        series = reader.series(node="n0", role="n0", iteration=0)["training_step"].to_pylist()
        assert len(series) == len(set(series)) and set(steps) <= set(series), "a series misses or repeats a step"
    kpis = reader.kpis()["timepoint"].to_pylist()
    assert len(kpis) == len(set(kpis)), "a KPI point read twice"
    return len(steps)


def merged_chunks(trial_dir: Path) -> frozenset[str]:
    """The merged (level > 0) tensor chunks there now: a change between two listings is a compaction."""
    return frozenset(name for name in fmt.chunk_names(layout.rank_dir(trial_dir, "tensors", 0))
                     if (chunk := fmt.parse_chunk_name(name)) is not None and chunk.level > 0)


@dataclass
class Concurrency:
    plain: PlainFigures
    rounds: int  # rounds of comgra queries, each exact
    during_compaction: int  # of those, the rounds that a compaction overlapped
    written: int  # steps the writer wrote


def run_concurrently(directory: Path, *, seconds: float, merge_every: int,
                     enough: int | None = None) -> Concurrency:
    """Readers against a writer process. With ``enough``, they stop once that many rounds overlapped a compaction
    (``seconds`` is then only the limit); without it, after ``seconds``."""
    script, stop = directory / "writer.py", directory / "stop"
    script.write_text(WRITER)
    trial_dir = directory / "group" / "trials" / "trial"
    trial_dir.mkdir(parents=True)
    process = subprocess.Popen([sys.executable, str(script), str(trial_dir), str(seconds), str(merge_every), str(stop)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "STARTED"
    figures, rounds, during = PlainFigures(), 0, 0
    reader = TrialReader(trial_dir)
    try:
        with duckdb.connect() as connection:
            while process.poll() is None and (enough is None or during < enough):
                if any((layout.rank_dir(trial_dir, "tensors", 0)).glob("*.parquet")):
                    before = merged_chunks(trial_dir)
                    for _ in range(10):  # plain queries are cheap: measure many
                        _plain_query(connection, trial_dir, figures)
                    _comgra_queries(reader)
                    rounds += 1
                    during += merged_chunks(trial_dir) != before
            stop.touch()
            written = int(process.stdout.read().split()[-1])
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
    assert process.returncode == 0
    return Concurrency(figures, rounds, during, written)


@pytest.mark.slow
def test_readers_while_a_run_writes_and_compacts(tmp_path: Path) -> None:
    run = run_concurrently(tmp_path, seconds=120.0, merge_every=2, enough=5)
    figures = run.plain
    print(figures.describe(), f"; {run.rounds} rounds of comgra queries, all exact, {run.during_compaction} of them "
          "during a compaction", sorted(figures.errors))
    assert run.during_compaction >= 5, f"only {run.during_compaction} rounds overlapped a compaction in 120 s"
    assert figures.queries >= 50
    assert not any(".tmp" in error or "magic bytes" in error or "too small" in error for error in figures.errors), \
        "a plain reader met a temporary file"
    final = TrialReader(tmp_path / "group" / "trials" / "trial")  # after the run: exact for every reader
    assert _comgra_queries(final) == run.written
    with duckdb.connect() as connection:
        after = PlainFigures()
        _plain_query(connection, tmp_path / "group" / "trials" / "trial", after)
        assert after.failed == after.double_counted == 0


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        measured = run_concurrently(Path(scratch), seconds=float(sys.argv[1]) if len(sys.argv) > 1 else 10.0,
                                    merge_every=int(sys.argv[2]) if len(sys.argv) > 2 else 16)
        print(measured.plain.describe(), f"({measured.rounds} rounds of comgra queries exact, {measured.during_compaction}"
              f" during a compaction, {measured.written} steps written)")
        for message in sorted(measured.plain.errors)[:5]:
            print("  ", message)
