"""Write a sweep-shaped group quickly, without torch: N finished trials with hyperparameters and KPIs.

Each trial is what a small sweep trial leaves for the Runs view: trial.json (finished), the KPI table
written through the real ``ChunkWriter`` (a loss and an accuracy per step), and its hyperparameters
through ``store.hyperparameters`` (lr, width, optimizer, seed). Trials of the same (lr, width,
optimizer) differ by seed only, so that grouping over seeds has something to average. ``--running K``
leaves the last K trials without the finished marker (their writers are gone: they read as crashed).

    python benchmarks/sweep_group.py benchmarks/out/sweep1000 --trials 1000 --steps 50
"""
from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from comgra.store import format as fmt
from comgra.store import hyperparameters
from comgra.store.writer import ChunkWriter

LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
WIDTHS = (32, 64, 128, 256)
OPTIMIZERS = ("adam", "sgd")
SEEDS_PER_SETTING = 5


def settings(trials: int) -> list[dict[str, object]]:
    """The hyperparameters of each trial: the grid, then seeds, until ``trials`` are made."""
    grid = list(itertools.product(LEARNING_RATES, WIDTHS, OPTIMIZERS))
    made = []
    for index in range(trials):
        lr, width, optimizer = grid[(index // SEEDS_PER_SETTING) % len(grid)]
        made.append({"lr": lr, "model": {"width": width}, "optimizer": optimizer,
                     "seed": index % SEEDS_PER_SETTING + SEEDS_PER_SETTING * (index // (SEEDS_PER_SETTING * len(grid)))})
    return made


def kpi_table(rng: np.random.Generator, steps: int, lr: float, width: int) -> pa.Table:
    timepoints = np.arange(steps)
    rate = 3.0 * min(1.0, lr / 1e-3) * (width / 128) ** 0.25
    loss = np.exp(-rate * timepoints / max(1, steps - 1)) + rng.normal(0, 0.02, steps) ** 2
    if lr >= 1e-2:
        loss[steps // 2:] += np.linspace(0, 2, steps - steps // 2)  # too high a rate diverges
    accuracy = 1.0 - loss / (1.0 + loss)
    return pa.table({
        "kpi_group": ["loss"] * steps + ["accuracy"] * steps, "kpi_name": ["train"] * steps + ["val"] * steps,
        "type_of_execution": ["main_execution_type"] * (2 * steps),
        "timepoint": np.concatenate([timepoints, timepoints]), "value": np.concatenate([loss, accuracy]),
    }, schema=fmt.KPIS_SCHEMA)


def write_trial(group_dir: Path, trial_id: str, values: dict[str, object], steps: int, *, finished: bool,
                seed: int) -> None:
    directory = fmt.trial_dir(group_dir, trial_id)
    directory.mkdir(parents=True, exist_ok=True)
    created = time.time()
    metadata = {"format_version": fmt.FORMAT_VERSION, "trial_id": trial_id, "group": group_dir.name,
                "created": created, "comgra_version": "synthetic", "modules": [], "config": {},
                "types_of_execution": ["main_execution_type"] if finished else []}
    if finished:
        metadata["finished"] = created + steps * 0.01
    fmt.write_json_atomic(directory / fmt.TRIAL_META, metadata)
    writer = ChunkWriter(directory, flush_seconds=3600)
    rng = np.random.default_rng(seed)
    writer.put_table("kpis", kpi_table(rng, steps, float(values["lr"]), int(values["model"]["width"])))  # type: ignore[index]
    writer.close()
    hyperparameters.write(group_dir, trial_id, hyperparameters.flatten(values))


def write_group(group_dir: Path, trials: int, steps: int, *, running: int = 0) -> Path:
    """The group (made once: an existing group of this shape is kept)."""
    marker = group_dir / f".sweep-{trials}-{steps}-{running}"
    if marker.is_file():
        return group_dir
    group_dir.mkdir(parents=True, exist_ok=True)
    for index, values in enumerate(settings(trials)):
        write_trial(group_dir, f"trial_{index:05d}", values, steps, finished=index < trials - running, seed=index)
    marker.write_text("complete\n")
    return group_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("group", type=Path)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--running", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    write_group(args.group, args.trials, args.steps, running=args.running)
    print(f"{args.trials} trials in {args.group} ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
