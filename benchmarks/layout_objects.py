"""Objects per trial and what they cost: format 2 (before) against format 3 without and with compaction.

A sweep of small 10-step MLP trials (the recorder, every step recorded) is recorded by each configuration in a
process of its own, the configurations taking turns (``--rounds``), and read back by comgra's reader:

    python benchmarks/layout_objects.py [--before main] [--trials 10] [--rounds 3]

``--before`` (default ``main``: format 2) is loaded from git into a temporary folder; format 3 is this working
tree's ``src``, once with the writer's compaction at close turned off and once as it ships (on). Each is run with
the recorder's default flush interval (2 s: a 10-step trial of a small MLP is flushed once, at ``finalize``) and with
``flush_seconds=0`` (a flush per step, as a run with slow steps flushes): compaction only has work in the second.

Figures per trial (medians over the trials, then over the rounds): Parquet files, all files (JSON documents and
lock files too), bytes; ``finalize`` in ms (the flush of what is left, and compaction); the training loop per step
in ms (the writer's cost shows here); and a fresh reader's ``steps()``, ``selection`` of one step and ``series``
of one node, in ms. Prints the load average the run began and ended at: other load moves the times.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STEPS = 10


def worker(folder: Path, trials: int, flush_seconds: float, compact: bool) -> dict[str, float]:
    import torch

    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder
    from comgra.store import GroupReader
    from comgra.store import format as fmt

    if not compact:
        import comgra.capture.session as session

        session.ChunkWriter = functools.partial(session.ChunkWriter, compact_at_close=False)  # type: ignore[misc]
    finalize, loop = [], []
    for index in range(trials):
        recorder = ComgraRecorder(folder, "sweep", f"lr={index / 100}", DecisionMakerForRecordingsHardcoded(
            set(range(STEPS))), max_num_batch_size_to_record=2, max_num_neurons_to_record=8,
            flush_seconds=flush_seconds)
        torch.manual_seed(index)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        recorder.track_module("model", model)
        start = time.perf_counter()
        for step in range(STEPS):
            recorder.start_batch(step, 8)
            recorder.start_iteration()
            x = torch.randn(8, 16)
            recorder.register_tensor("x", x, is_input=True)
            loss = model(x).pow(2).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            loss.backward()
            recorder.record_current_gradients("gradients")
            recorder.record_kpi_in_graph("loss", "mean", loss, record_even_if_recording_is_inactive=True)
            recorder.finish_iteration()
            recorder.finish_batch()
            optimizer.step()
            optimizer.zero_grad()
        loop.append((time.perf_counter() - start) / STEPS)
        start = time.perf_counter()
        recorder.finalize()
        finalize.append(time.perf_counter() - start)
    group = folder / "sweep"
    files = [p for p in group.rglob("*") if p.is_file()]
    parquet = [p for p in files if p.suffix == ".parquet"]
    reader = GroupReader(group)
    assert len(reader.trials()) == trials
    queries: dict[str, list[float]] = {"steps": [], "selection": [], "series": []}
    for trial_id in reader.trials():
        reader.close()
        trial = reader.trial(trial_id)
        for name, call in (("steps", trial.steps), ("selection", lambda: trial.selection(training_step=5)),
                           ("series", lambda: trial.series(node="x", role="x", iteration=0))):
            start = time.perf_counter()
            rows = call()
            queries[name].append(time.perf_counter() - start)
            assert rows.num_rows
        assert not trial.problems
    reader.close()
    duckdb_figures = _duckdb_rank_sources(group) if fmt.FORMAT_VERSION >= 3 else {}
    return {**duckdb_figures, "format": float(fmt.FORMAT_VERSION), "parquet files per trial": len(parquet) / trials,
            "files per trial": len(files) / trials, "KB per trial": sum(p.stat().st_size for p in files) / trials / 1e3,
            "finalize, ms": statistics.median(finalize) * 1e3, "loop per step, ms": statistics.median(loop) * 1e3,
            **{f"fresh {name}, ms": statistics.median(times) * 1e3 for name, times in queries.items()}}


def _duckdb_rank_sources(group: Path) -> dict[str, float]:
    """Format 3 in DuckDB, one step of one trial from a fresh connection: ``rank`` from its Hive folder
    (``hive_partitioning``) against a constant per rank (what comgra's reader does), interleaved."""
    import duckdb

    files = [str(p) for p in sorted((group / "tensors").glob("*/rank=0/*.parquet"))][:1]
    forms = {"duckdb hive rank, ms": "SELECT * EXCLUDE (trial) FROM read_parquet(?, hive_partitioning = true, "
                                     "hive_types = {'trial': VARCHAR, 'rank': INTEGER}) WHERE training_step = 5",
             "duckdb constant rank, ms": 'SELECT *, CAST(0 AS INTEGER) AS "rank" FROM read_parquet(?, '
                                         "hive_partitioning = false) WHERE training_step = 5"}
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(20):
        for name, sql in forms.items():
            connection = duckdb.connect()
            start = time.perf_counter()
            connection.sql(sql, params=[files]).to_arrow_table()
            times[name].append(time.perf_counter() - start)
            connection.close()
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def run(src: Path, args: argparse.Namespace, flush_seconds: float, compact: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="comgra-layout-") as folder:
        out = subprocess.run([sys.executable, __file__, "--worker", folder, "--trials", str(args.trials),
                              "--flush-seconds", str(flush_seconds), *(["--no-compaction"] if not compact else [])],
                             env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="main")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flush-seconds", type=float, default=2.0)
    parser.add_argument("--no-compaction", action="store_true")
    parser.add_argument("--worker", type=Path)
    args = parser.parse_args()
    if args.worker is not None:
        import comgra.store.format as fmt

        fmt.DURABLE_WRITES = True  # as shipped
        print(json.dumps(worker(args.worker, args.trials, args.flush_seconds, not args.no_compaction)))
        return
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="comgra-before-") as before:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "src"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        configurations = {"format 2 (before)": (Path(before) / "src", True),
                          "format 3, no compaction": (ROOT / "src", False),
                          "format 3, compaction": (ROOT / "src", True)}
        for flush_seconds in (2.0, 0.0):
            results: dict[str, list[dict[str, float]]] = {name: [] for name in configurations}
            for _ in range(args.rounds):  # interleaved: each round runs every configuration once
                for name, (src, compact) in configurations.items():
                    results[name].append(run(src, args, flush_seconds, compact))
            print(f"\n{args.trials} trials x {STEPS} steps, flush_seconds={flush_seconds}, "
                  f"median of {args.rounds} interleaved rounds")
            _print(results)
    print(f"\nload average (1 min): {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end, {os.cpu_count()} CPUs")


def _print(results: dict[str, list[dict[str, Any]]]) -> None:
    names = list(results)
    figures = list(dict.fromkeys(f for n in names for r in results[n] for f in r))
    print(f"{'':28}" + "".join(f"{n:>26}" for n in names))
    for figure in figures:
        values = [statistics.median(r[figure] for r in results[n]) if figure in results[n][0] else None
                  for n in names]
        print(f"{figure:28}" + "".join(f"{v:>26.2f}" if v is not None else f"{'-':>26}" for v in values))


if __name__ == "__main__":
    main()
