"""Recording an FSDP2 model: collectives, bytes, time and peak memory against the same run without comgra.

Every measurement is a fresh ``torchrun --nproc_per_node=2`` (gloo, CPU) of an MLP of ``--layers`` layers
of ``--width`` x ``--width`` (default 8 x 2048 x 2048: 33.6M parameters, 134 MB in float32, 67 MB a rank),
each layer and the model ``fully_shard``ed, trained with SGD; the modes take turns round by round, so drift
on a noisy machine hits them alike. Each rank times its training loop after a barrier; the slower rank
counts (a step waits for it). Peak RSS is the process's high-water mark (``ru_maxrss``) at the end, the
larger of the two ranks.

    python benchmarks/fsdp_overhead.py [--rounds 3] [--steps 40] [--layers 8] [--width 2048]

Modes:
``none``      comgra not imported;
``off``       comgra imported and a recorder open (its folder, writer thread, statistics kernel, pyarrow and
              pandas loaded) whose policy records no step: the fixed cost of having comgra in the process;
``every_10``  comgra records 1 step in 10: every parameter and gradient (DTensors, combined from the shards),
              the input and each layer's output (this rank's batch);
``gathered``  as ``every_10``, and at each recorded step the full tensor of every parameter and gradient is
              gathered (``full_tensor()``) and held at once, as a recorder that gathers would: what the memory
              check must be able to see.

Printed: comgra's collectives and bytes per recorded step (counted by comgra's combiner), the median time,
peak RSS and peak C heap in use (``HeapPeak``) of each mode, their ratios to ``none``, and the peak RSS ratio
to ``off`` (what recording adds beyond having comgra loaded). The larger rank's figures count.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MODES = ("none", "off", "every_10", "gathered")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


class HeapPeak:
    """The most bytes the C heap held in use (glibc's ``mallinfo2``: allocated chunks plus mmapped blocks), sampled
    every 2 ms on a thread. Unlike the RSS high-water mark, it sees a transient allocation that lands in memory the
    heap already holds (FSDP2 on the CPU leaves the heap at several times the shard size, so a gathered copy of
    the whole model fits in what was freed, and ru_maxrss does not move)."""

    def __init__(self) -> None:
        self.peak = 0
        self._done = threading.Event()
        function = ctypes.CDLL("libc.so.6").mallinfo2
        function.restype = _Mallinfo2
        self._read = function
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.002):
            info = self._read()
            self.peak = max(self.peak, info.uordblks + info.hblkhd)

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return self.peak / 2**20


def worker(mode: str, steps: int, layers: int, width: int, root: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = torch.Generator().manual_seed(rank)
    batches = [torch.randn(16, width, generator=data) for _ in range(4)]
    recorder = _recorder(mode, root, model, steps)
    dist.barrier()
    heap = HeapPeak()
    start = time.perf_counter()
    for step in range(steps):
        x = batches[step % len(batches)]
        recording = recorder is not None
        if recording:
            recorder.start_batch(step, len(x))
            recorder.start_iteration()
            recorder.register_tensor("input", x, is_input=True)
        hidden = x
        for index, layer in enumerate(model):
            hidden = torch.relu(layer(hidden))
            if recording:
                recorder.register_tensor(f"layer{index}", hidden)
        loss = (hidden ** 2).mean()
        if recording:
            recorder.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        if recording:
            if mode == "gathered" and recorder.recording_is_active():
                # what a gathering recorder would hold at once: every parameter and gradient, whole
                gathered = [t.full_tensor() for p in model.parameters() for t in (p, p.grad)]
                del gathered
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            recorder.finish_batch()
        optimizer.step()
    seconds = time.perf_counter() - start
    heap_mib = heap.stop()
    combiner = recorder.session.combiner if recorder is not None else None
    collectives, moved = (combiner.collectives, combiner.bytes_moved) if combiner is not None else (0, 0)
    if recorder is not None:
        recorder.finalize()
    figures = torch.tensor([seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, heap_mib],
                           dtype=torch.float64)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    if rank == 0:
        recorded = len(range(0, steps, 10)) if mode not in ("none", "off") else 0
        print(json.dumps({"mode": mode, "seconds": figures[0].item(), "peak_rss_mib": figures[1].item(),
                          "peak_heap_mib": figures[2].item(),
                          "collectives_per_recorded_step": collectives / recorded if recorded else 0,
                          "bytes_per_recorded_step": moved / recorded if recorded else 0}))
    dist.destroy_process_group()


def _recorder(mode: str, root: str, model: Any, steps: int) -> Any:
    if mode == "none":
        return None
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    recorded = set() if mode == "off" else set(range(0, steps, 10))
    recorder = ComgraRecorder(root, "fsdp", mode, DecisionMakerForRecordingsHardcoded(recorded), resource_seconds=None)
    recorder.track_module("model", model)
    return recorder


def run_once(mode: str, arguments: argparse.Namespace, root: Path) -> dict[str, float]:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__,
               "--worker", mode, "--steps", str(arguments.steps), "--layers", str(arguments.layers),
               "--width", str(arguments.width), "--root", str(root)]
    completed = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if completed.returncode != 0:
        raise RuntimeError(f"torchrun failed ({completed.returncode}) in mode {mode!r}:\n{completed.stderr[-4000:]}")
    line = [entry for entry in completed.stdout.splitlines() if entry.startswith("{")][-1]
    return json.loads(line)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--worker", choices=MODES)
    parser.add_argument("--root")
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments.worker, arguments.steps, arguments.layers, arguments.width, arguments.root)
        # The figures are printed and the process group is gone. The interpreter's teardown after FSDP2 on gloo
        # aborts now and then ("terminate called without an active exception") with comgra not imported at all
        # (mode none, 1 run in 3 on a loaded machine; torch's gloo threads, cf. pytorch/pytorch#190489): leave
        # as tests/distributed's workers do.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(arguments.rounds):
            for mode in MODES:
                runs[mode].append(run_once(mode, arguments, Path(root)))
    parameters = arguments.layers * (arguments.width * arguments.width + arguments.width)
    print(f"2 ranks (gloo, CPU), FSDP2, {arguments.layers} x {arguments.width}^2 ({parameters / 1e6:.1f}M parameters, "
          f"{parameters * 4 / 2**20:.0f} MiB), {arguments.steps} steps, 1 in 10 recorded, median of "
          f"{arguments.rounds} interleaved rounds")
    base_time = statistics.median(r["seconds"] for r in runs["none"])
    base_rss = statistics.median(r["peak_rss_mib"] for r in runs["none"])
    off_rss = statistics.median(r["peak_rss_mib"] for r in runs["off"])
    base_heap = statistics.median(r["peak_heap_mib"] for r in runs["none"])
    print(f"{'mode':<10} {'seconds':>8} {'ratio':>6} {'peak RSS MiB':>13} {'ratio':>6} {'to off':>6} "
          f"{'heap MiB':>9} {'ratio':>6} {'collectives':>12} {'bytes':>8}  (per recorded step; all rounds' seconds)")
    for mode, values in runs.items():
        seconds = statistics.median(r["seconds"] for r in values)
        rss = statistics.median(r["peak_rss_mib"] for r in values)
        heap = statistics.median(r["peak_heap_mib"] for r in values)
        print(f"{mode:<10} {seconds:8.2f} {seconds / base_time:6.3f} {rss:13.1f} {rss / base_rss:6.3f} {rss / off_rss:6.3f} "
              f"{heap:9.1f} {heap / base_heap:6.3f} "
              f"{values[0]['collectives_per_recorded_step']:12.0f} {values[0]['bytes_per_recorded_step']:8.0f}  "
              + " ".join(f"{r['seconds']:.2f}" for r in values))
    print("peak RSS MiB of each round: " + "; ".join(
        f"{mode} " + " ".join(f"{r['peak_rss_mib']:.0f}" for r in values) for mode, values in runs.items()))
    print("peak heap MiB of each round: " + "; ".join(
        f"{mode} " + " ".join(f"{r['peak_heap_mib']:.0f}" for r in values) for mode, values in runs.items()))


if __name__ == "__main__":
    main()
