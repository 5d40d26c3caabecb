"""What the detectors of training bugs (loss curve to accidental detach, and the explanations) add to a scan in memory.

Scans one recording's trials in this process with every detector and with only the detectors a streamed scan runs
(``comgra.analysis.detectors.STREAMED``), alternating, each from chunks already read (the cache is warm: the
detectors' time, not the reading), and prints the median times and their ratio.

    python benchmarks/healthy_model_scan.py --out /tmp/healthy --steps 300 --record-every 3
    python benchmarks/training_bug_detectors_cost.py --group /tmp/healthy/healthy_gpt2 --repeats 3
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from comgra.analysis import ScanOptions, detectors, loading
    from comgra.store.reader import GroupReader

    group = GroupReader(args.group)
    cache = loading.ChunkCache()
    trials = [cache.load(group.trial(t)) for t in group.trials()]  # read once: the detectors' time is measured
    every = dict(detectors.DETECTORS)
    streamed = {name: every[name] for name in detectors.STREAMED}
    times: dict[str, list[float]] = {"all": [], "streamed_set": []}
    counts = {}
    for _ in range(args.repeats):
        for name, chosen in (("all", every), ("streamed_set", streamed)):
            detectors.DETECTORS = chosen
            start = time.perf_counter()
            found = [detectors.detect_all(data, ScanOptions())[0] for data in trials]
            times[name].append(time.perf_counter() - start)
            counts[name] = sum(len(f) for f in found)
    detectors.DETECTORS = every
    rows = sum(len(data.stats) for data in trials)
    for name, values in times.items():
        print(f"{name:13} median {statistics.median(values):6.2f} s over {args.repeats} ({counts[name]} findings, "
              f"{rows} statistics rows)")
    ratio = statistics.median(times["all"]) / statistics.median(times["streamed_set"])
    print(f"every detector / the streamed set: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
