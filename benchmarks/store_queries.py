"""Query cost against recording size: a selection and a series, on a small and a large recording.

The store's promise: a query for one selection (step, node, role, kind, iteration, batch) and a
query for one statistic across all steps cost in proportion to their answer, not to the recording.
This writes a tutorial-sized synthetic recording and one ``--scale`` times larger (more recorded
steps, same network), then times both queries on each, side by side in one run:

    python benchmarks/store_queries.py [--scale 50] [--repeats 30]

A selection returns the same rows on both, so its time should stay flat; a series returns
``scale`` times more rows, so its time per returned row should stay flat.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_recording import Options, write_recording  # noqa: E402

from comgra.store import GroupReader  # noqa: E402


def timed(function, repeats: int) -> tuple[float, int]:
    """Median seconds of ``repeats`` calls, and the rows of the last answer."""
    times, rows = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        rows = function().num_rows
        times.append(time.perf_counter() - start)
    return statistics.median(times), rows


def measure(group_dir: Path, repeats: int) -> dict[str, tuple[float, int]]:
    trial = GroupReader(group_dir).trial(GroupReader(group_dir).trials()[0])
    steps = trial.steps()["training_step"].unique().to_pylist()
    rng = random.Random(0)
    trial.selection(training_step=steps[0], node="input")  # opens DuckDB once, as the app does at start
    selection = lambda: trial.selection(  # noqa: E731
        training_step=rng.choice(steps), node="subnet_pre__out", role="subnet_pre__out", kind="forward",
        iteration=0, aggregation="mean")
    whole_step = lambda: trial.selection(training_step=rng.choice(steps))  # noqa: E731
    series = lambda: trial.series(node="subnet_pre__out", role="subnet_pre__out", kind="forward",  # noqa: E731
                                  iteration=0, aggregation="mean", statistic="abs_mean")
    chunks = len(list((trial.directory / "tensors").glob("*.parquet")))
    return {"steps": (len(steps), chunks), "selection": timed(selection, repeats),
            "whole step": timed(whole_step, repeats), "series": timed(series, max(3, repeats // 3))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        small = write_recording(Path(folder) / "small", Options(scale=1.0, trials=1))
        large = write_recording(Path(folder) / "large", Options(scale=args.scale, trials=1))
        results = {"1x": measure(small, args.repeats), f"{args.scale:g}x": measure(large, args.repeats)}
    (small_name, s), (large_name, l) = results.items()
    print(f"recorded steps / tensor chunks: {small_name} {s['steps'][0]} / {s['steps'][1]}, "
          f"{large_name} {l['steps'][0]} / {l['steps'][1]}")
    print(f"{'query':<12}{'rows ' + small_name:>10}{'ms ' + small_name:>10}{'rows ' + large_name:>11}"
          f"{'ms ' + large_name:>10}{'time ratio':>12}{'per-row ratio':>15}")
    for query in ("selection", "whole step", "series"):
        (ts, rs), (tl, rl) = s[query], l[query]
        print(f"{query:<12}{rs:>10}{ts * 1e3:>10.2f}{rl:>11}{tl * 1e3:>10.2f}{tl / ts:>12.2f}"
              f"{(tl / max(rl, 1)) / (ts / max(rs, 1)):>15.2f}")


if __name__ == "__main__":
    main()
