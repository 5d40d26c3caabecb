"""Recording cost under DDP: a 2-rank torchrun run with comgra recording against the same run without it.

Every measurement is a fresh ``torchrun --nproc_per_node=2`` (gloo, CPU) of a small DDP model; the
modes are interleaved round by round, so drift on a noisy machine hits them alike. Each rank times
its training loop (after a barrier, without start-up), and the slower rank counts: a DDP step waits
for the slowest rank. Prints the median time per mode and its ratio to the run without comgra.

    python benchmarks/ddp_overhead.py [--rounds 5] [--steps 300]

Modes: ``none`` (comgra not imported), ``schedule`` (every rank records on the tutorial's schedule,
FrequencyPerType(min_training_steps_difference=1000)), ``every_10`` (every rank records 1 step in 10).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {"none": None, "schedule": 1000, "every_10": 10}


def worker(mode: str, steps: int, root: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(64, 64, generator=data), torch.randint(0, 10, (64,), generator=data)) for _ in range(8)]
    recorder = _recorder(mode, root, model)
    dist.barrier()
    start = time.perf_counter()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        if recorder is not None:
            recorder.start_batch(step, len(x))
            recorder.start_iteration()
            recorder.register_tensor("input", x, is_input=True)
        logits = ddp(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        if recorder is not None:
            recorder.register_tensor("logits", logits)
            recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        if recorder is not None:
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            recorder.finish_batch()
        optimizer.step()
    if recorder is not None:
        recorder.finalize()
    seconds = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # a DDP step waits for the slowest rank
    if rank == 0:
        print(json.dumps({"mode": mode, "seconds": seconds.item()}))
    dist.destroy_process_group()


def _recorder(mode: str, root: str, model: object) -> object:
    if MODES[mode] is None:
        return None
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder

    recorder = ComgraRecorder(root, "ddp", mode, DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=MODES[mode]))
    recorder.track_module("model", model)
    return recorder


def run_once(mode: str, steps: int, root: Path) -> float:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               __file__, "--worker", mode, "--steps", str(steps), "--root", str(root)]
    completed = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if completed.returncode != 0:
        raise RuntimeError(f"torchrun failed ({completed.returncode}) in mode {mode!r}:\n{completed.stderr[-4000:]}")
    line = [entry for entry in completed.stdout.splitlines() if entry.startswith("{")][-1]
    return float(json.loads(line)["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--worker", choices=list(MODES))
    parser.add_argument("--root")
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments.worker, arguments.steps, arguments.root)
        return
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(arguments.rounds):
            for mode in MODES:
                times[mode].append(run_once(mode, arguments.steps, Path(root)))
    base = statistics.median(times["none"])
    print(f"2 ranks (gloo, CPU), {arguments.steps} steps, median of {arguments.rounds} interleaved rounds")
    print(f"{'mode':<10} {'seconds':>8} {'ratio':>6}  all rounds")
    for mode, values in times.items():
        median = statistics.median(values)
        print(f"{mode:<10} {median:8.3f} {median / base:6.3f}  {' '.join(f'{v:.3f}' for v in values)}")


if __name__ == "__main__":
    main()
