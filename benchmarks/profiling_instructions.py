"""Instructions per training step, profiling on and off, counted by callgrind: a figure that a busy machine
does not change (the time ratios of benchmarks/profiling.py swing by ±15% at a load of 10).

Run one variant per process under callgrind with instrumentation off; the script switches it on only
around the measured steps (``callgrind_control -i on``), after one pass over the 16 batches as warm-up:

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/off.cg \\
        python benchmarks/profiling_instructions.py off 16
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/on.cg \\
        python benchmarks/profiling_instructions.py on 16

and divide the two "Collected" counts. All threads are counted (the writer's too), and the writer's
flushes are timed, so counts vary by about 1% between runs. Instructions are not time: a hook that the
autograd engine calls must take the GIL, which costs time that no instruction count shows.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import profiling as bench  # noqa: E402


FLUSH_SECONDS_UNDER_VALGRIND = 3600.0


def main() -> None:
    variant, steps = sys.argv[1], int(sys.argv[2])
    workload = sys.argv[3] if len(sys.argv) > 3 else "tutorial"
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        # Under valgrind a step takes about 50 times as long: the usual 2-s flush would fire on nearly every
        # step and be counted as per-step cost. One flush at the end instead (finalize, not counted).
        step = bench.WORKLOADS[workload](Path(root), variant, flush_seconds=FLUSH_SECONDS_UNDER_VALGRIND)
        for index in range(16):  # one pass over the batches: the measured steps see the same lengths
            step(index)
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True, check=False)
        for index in range(steps):
            step(16 + index)
        subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], capture_output=True, check=False)
        step.recorder.finalize()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
