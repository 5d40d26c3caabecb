"""How long the panels' data questions take on the server: the samples table, its column choices, a comparison,
and the Graphs tab's overlaid KPI figures (service + figure building, no browser).

It writes the synthetic recording of ``synthetic_recording.py`` (two trials, the tutorial's 15 nodes) at each
``--scale`` and asks each question at ``--repeats`` random recorded steps (fresh service per scale, so the first
answers pay the cold caches too), printing the median and the maximum in milliseconds.

    python benchmarks/panel_queries.py                    # scales 1 and 50
    python benchmarks/panel_queries.py --scale 1 --repeats 50
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_recording  # noqa: E402

from comgra.server import figures  # noqa: E402
from comgra.service import RecordingService, SampleColumn  # noqa: E402

COLUMNS = [SampleColumn("loss_per_sample", "loss_per_sample"), SampleColumn("helper_partial_sums", "partial_sums"),
           SampleColumn("output", "output", statistic="neuron", neuron=2),
           SampleColumn("subnet_mem__out", "subnet_mem__out", kind="gradients", statistic="abs_max")]


def timed(question: Callable[[], object], repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        question()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


def measure(group: Path, repeats: int, seed: int = 0) -> dict[str, tuple[float, float]]:
    service = RecordingService(group)
    trials = service.trials()
    rows = [r for r in service.step_index(trials[0]).table.to_pylist()]
    last = {}
    for r in rows:  # the last iteration of every recorded step: loss_per_sample exists there
        last[r["training_step"]] = r["iteration"]
    rng = random.Random(seed)
    picks = iter([rng.choice(sorted(last)) for _ in range(repeats * 4)])

    def samples() -> object:
        step = next(picks)
        return service.samples_table(trials[0], step, last[step], COLUMNS)

    def choices() -> object:
        step = next(picks)
        return service.sample_columns(trials[0], step, last[step])

    def compare() -> object:
        step = next(picks)
        here = service.resolve({"trial": trials[0], "training_step": step, "node_id": "output"}).selection
        assert here is not None
        return service.compare(here, service.counterpart(here, trial=trials[-1]).selection or here)

    def kpis() -> object:
        return figures.kpi_overlay_figures({t: service.kpis(t) for t in trials}, figures.KpiOptions(smoothing=0.6))

    result = {"samples table (4 columns)": timed(samples, repeats), "column choices": timed(choices, repeats),
              "compare (counterpart + rows)": timed(compare, repeats),
              f"KPI overlay, {len(trials)} trials, smoothed": timed(kpis, max(3, repeats // 10))}
    service.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, action="append", help="recording scale (repeatable; default 1 and 50)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, help="folder for the recordings (default: a temporary one)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="comgra-panels-"))
    print("| scale | question | median ms | max ms |\n|---|---|---|---|")
    for scale in args.scale or [1.0, 50.0]:
        folder = out / f"scale-{scale:g}"
        group = folder / "synthetic"
        if not group.is_dir():
            synthetic_recording.write_recording(folder, synthetic_recording.Options(scale=scale))
        for question, (median, worst) in measure(group, args.repeats).items():
            print(f"| {scale:g} | {question} | {median:.1f} | {worst:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
