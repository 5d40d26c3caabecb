"""A long run: 100,000 training steps, a KPI on every step, recordings on the usual schedule.

The model is deliberately tiny (Linear(8, 16) - ReLU - Linear(16, 1), batch 8) so that the run
finishes in a few minutes on two cores: what is measured is the store, not the model. Every
step calls record_kpi_in_graph; one step in ``--every`` (default 100) is recorded in full.

Printed at the end: wall time, bytes and number of files per table, peak RSS, the memory at every
tenth of the run (RSS, its anonymous part, and with ``--tracemalloc`` Python's traced heap), whether
memory is flat, and the reader's latency for the step index, one selection and one series (a fresh
reader, then the same reader again).

Flat memory, as measured here: RSS is sampled at every hundredth of the run; over the second half
(the first holds the one-time costs: the first merges load Parquet's reading code, the flush
interval grows with the run's age) it grows by at most ``FLAT_MIB``, from the median of the tenth
of samples before the middle to the median of the last tenth. The highest sample is printed too.

    python benchmarks/long_run.py                  # 100,000 steps
    python benchmarks/long_run.py --steps 5000     # a quick look
    python benchmarks/long_run.py --tracemalloc    # also Python's heap (about 2x slower)
"""
from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch

from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder
from comgra.store import GroupReader
from comgra.store import format as fmt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_memory import anonymous_resident_mib, resident_mib  # noqa: E402

FLAT_MIB = 4.0  # about 1% of this process's RSS (~420 MiB, most of it torch)


def memory_now() -> dict[str, float]:
    memory = {"rss": resident_mib(), "anon": anonymous_resident_mib()}
    if tracemalloc.is_tracing():
        gc.collect()
        memory["python"] = tracemalloc.get_traced_memory()[0] / 2**20
    return memory


def train(root: Path, steps: int, every: int) -> list[tuple[int, dict[str, float]]]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    recorder = ComgraRecorder(root, "long", "trial", DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=every))
    recorder.track_module("model", model)
    inputs, targets = torch.randn(64, 8, 8), torch.randn(64, 8, 1)
    marks = {steps * q // 100 - 1 for q in range(1, 101)}
    memory = []
    for step in range(steps):
        x, y = inputs[step % 64], targets[step % 64]
        recorder.start_batch(step, 8)
        recorder.start_iteration()
        recorder.register_tensor("x", x, is_input=True)
        out = model(x)
        recorder.register_tensor("out", out)
        loss = (out - y).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.record_kpi_in_graph("loss", "", loss, record_even_if_recording_is_inactive=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        if step in marks:
            memory.append((step + 1, memory_now()))
    recorder.finalize()
    return memory


def print_flatness(memory: list[tuple[int, dict[str, float]]]) -> None:
    """Flat: RSS at the end of the run (the median of its last tenth of samples) is at most FLAT_MIB above
    RSS at the middle (the median of the tenth before it). Medians, so that a merge in progress (it holds
    its parts and the merged chunk at once, for a moment) is not taken for growth; the highest sample of
    the second half is printed beside them."""
    rss = [values["rss"] for _, values in memory]
    tenth = max(1, len(rss) // 10)
    half = len(rss) // 2
    at_middle, at_end = statistics.median(rss[half - tenth:half]), statistics.median(rss[-tenth:])
    grown, highest = at_end - at_middle, max(rss[half:]) - at_middle
    verdict = "flat" if grown <= FLAT_MIB else "NOT flat"
    print(f"  second half: RSS {at_middle:.1f} MiB at the middle, {at_end:.1f} MiB at the end ({grown:+.1f} MiB, "
          f"medians of {tenth} samples): {verdict} (bound +{FLAT_MIB:g} MiB); highest sample {highest:+.1f} MiB "
          "above the middle")


def timed(call):
    began = time.perf_counter()
    result = call()
    return result, (time.perf_counter() - began) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=100, help="record one step in this many (default: 100)")
    parser.add_argument("--root", type=Path, help="where to record (default: a new temporary folder)")
    parser.add_argument("--tracemalloc", action="store_true", help="also trace Python's heap (about 2x slower)")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="comgra-long-run-"))
    if args.tracemalloc:
        tracemalloc.start()

    began, cpu = time.perf_counter(), time.process_time()
    memory = train(root, args.steps, args.every)
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    print(f"{args.steps} steps, 1 in {args.every} recorded, a KPI every step: {seconds:.1f} s wall, {cpu:.1f} s CPU "
          f"({seconds / args.steps * 1e6:.0f} us/step) into {root}")
    trial_dir = fmt.trial_dir(root / "long", "trial")
    for table in fmt.TABLES:
        files = list((trial_dir / table).iterdir()) if (trial_dir / table).is_dir() else []
        print(f"  {table:8s} {len(files):4d} files {sum(f.stat().st_size for f in files) / 2**20:8.2f} MiB")
    total = [p for p in trial_dir.rglob("*") if p.is_file()]
    print(f"  all      {len(total):4d} files {sum(f.stat().st_size for f in total) / 2**20:8.2f} MiB")
    print(f"  memory (MiB) at every tenth of the run; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
    tenths = memory[9::10]
    for step, values in tenths:
        print(f"    {step:7d} steps: " + ", ".join(f"{name} {mib:.2f}" for name, mib in values.items()))
    first, last = tenths[0][1], tenths[-1][1]
    print("  from the first tenth to the end: " + ", ".join(
        f"{name} {last[name] - first[name]:+.1f} MiB ({(last[name] / first[name] - 1) * 100:+.1f}%)" for name in first))
    print_flatness(memory)

    for label in ("fresh reader", "same reader"):
        trial = GroupReader(root / "long").trial("trial") if label == "fresh reader" else trial
        index, index_ms = timed(trial.steps)
        last = index["training_step"].to_pylist()[-1]
        selection, selection_ms = timed(lambda: trial.selection(training_step=last))
        series, series_ms = timed(lambda: trial.series(node="out", role="out", iteration=0))
        kpis, kpis_ms = timed(trial.kpis)
        print(f"  {label}: step index {index_ms:.0f} ms ({index.num_rows} steps), selection {selection_ms:.0f} ms "
              f"({selection.num_rows} rows), series {series_ms:.0f} ms ({series.num_rows} points), "
              f"KPIs {kpis_ms:.0f} ms ({kpis.num_rows} points)")


if __name__ == "__main__":
    main()
