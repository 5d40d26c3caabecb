"""Profiling's cost with each variant in a process of its own, the processes taking turns in short blocks.

``benchmarks/profiling.py`` runs every variant in one process, which pairs them best against a machine whose
speed drifts, but shares one GIL: the background work of one variant (the writer thread turning the ``layers``
rows into Parquet) holds the GIL while another variant's step runs, and its cost is spread over all of them.
Here each variant has its own process (its own GIL, its own writer), kept alive for the whole run; the parent
asks them in turn, in a random order each round, to run a block of steps while the others wait, so that a
slow spell of the machine still hits every variant of a round alike. Torch's threads are left at their
default, as in a user's run. Figures: the paired median over rounds of each variant's block time against
``off``'s, with a distribution-free 95% interval, for wall time and the worker's training-thread CPU.

    python benchmarks/profiling_processes.py [--rounds 60] [--steps 40] [--variants off,on,on/py]
"""
from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import profiling as bench  # noqa: E402

WARM_UP = 40


def _worker(variant: str, root: str, connection: Any, threads: int) -> None:
    import torch

    from comgra.profiling import native_marker

    if threads:
        torch.set_num_threads(threads)

    native_marker.ensure_built()
    run = bench.tutorial_workload(Path(root), variant)
    index = 0
    for _ in range(WARM_UP):
        run(index)
        index += 1
    connection.send("ready")
    while True:
        steps = connection.recv()
        if steps is None:
            break
        start, start_main = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            run(index)
            index += 1
        connection.send(((time.perf_counter() - start) / steps, (time.thread_time() - start_main) / steps))
    run.recorder.finalize()  # type: ignore[attr-defined]
    connection.send("done")


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--variants", default="off,on,on/py")
    parser.add_argument("--threads", type=int, default=0, help="torch's intra-op threads in each worker (0: its default)")
    args = parser.parse_args(arguments)
    variants = list(dict.fromkeys(["off", *args.variants.split(",")]))
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as root:
        workers = {}
        for variant in variants:
            parent, child = context.Pipe()
            process = context.Process(target=_worker, args=(variant, str(Path(root) / variant.replace("/", "-")), child,
                                                                   args.threads))
            process.start()
            workers[variant] = (process, parent)
        for _, connection in workers.values():
            assert connection.recv() == "ready"
        order = random.Random(0)
        wall: dict[str, list[float]] = {variant: [] for variant in variants}
        main_cpu: dict[str, list[float]] = {variant: [] for variant in variants}
        for _ in range(args.rounds):
            for variant in order.sample(variants, len(variants)):
                connection = workers[variant][1]
                connection.send(args.steps)
                seconds, cpu = connection.recv()
                wall[variant].append(seconds)
                main_cpu[variant].append(cpu)
        for process, connection in workers.values():
            connection.send(None)
            connection.recv()
            process.join()
    print(f"tutorial, one process per variant, torch threads {args.threads or 'default'}, {args.rounds} rounds of {args.steps} steps each, the processes taking "
          "turns in a random order; ratios to 'off':")
    for clock, times in (("wall", wall), ("main", main_cpu)):
        for variant in variants:
            low, high = bench._paired_interval(times[variant], times["off"])
            print(f"  {clock} {variant:6s} median {statistics.median(times[variant]) * 1e3:6.2f} ms, "
                  f"paired {bench._paired(times[variant], times['off']):.3f}x (95%: {low:.3f}-{high:.3f}x)")


if __name__ == "__main__":
    main()
