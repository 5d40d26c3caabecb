"""The garbage collections of the tiny MLP's recorded steps, with a recorded step's rows built on the writer's thread (the
default since issue 34's sixth pass, capture/step.py ``LaterRows``) and with them built on the training thread
(``ChunkWriter.takes_later`` answering no: the way before). Child processes alternate between the two; each trains
the MLP 64-4x256-10 (batch 64; benchmarks/breakdown_workloads.py) with every step recorded and counts, with
``gc.callbacks``, the collections of each generation, on which thread, and their time (thread CPU), and the training
thread's CPU per step.

    python benchmarks/recorded_step_collections.py --steps 1500 --children 2
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def child(steps: int, on_writer: bool) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import breakdown_workloads as wl
    from comgra.store import writer
    wl.setup_process()
    if not on_writer:
        writer.ChunkWriter.takes_later = lambda self, size: False  # type: ignore[method-assign]
    workload = wl.WORKLOADS["mlp"]
    counts: dict[str, list[float]] = {}
    started: dict[int, float] = {}

    def callback(phase: str, info: dict[str, int]) -> None:
        thread = threading.get_ident()
        if phase == "start":
            started[thread] = time.thread_time()
            return
        key = f"gen{info['generation']} {'training' if thread == threading.main_thread().ident else 'other'}"
        found = counts.setdefault(key, [0, 0.0])
        found[0] += 1
        found[1] += time.thread_time() - started.pop(thread, time.thread_time())
    with tempfile.TemporaryDirectory() as folder:
        recorder = wl.make_recorder(Path(folder), "collections", "every1")
        trainer = wl.Trainer(workload, recorder)
        batches = [workload.batch(step) for step in range(20)]
        for batch in batches * 2:  # warm-up
            trainer.step(batch)
        gc.callbacks.append(callback)
        start = time.thread_time()
        for step in range(steps):
            trainer.step(batches[step % len(batches)])
        spent = (time.thread_time() - start) / steps * 1e3
        gc.callbacks.remove(callback)
        recorder.finalize()
    return {"counts": counts, "thread_ms_per_step": spent}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--children", type=int, default=2, help="child processes per side")
    parser.add_argument("--child", choices=("writer", "training"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print("RESULT " + json.dumps(child(options.steps, options.child == "writer")))
        return
    print(f"load average before: {os.getloadavg()[0]:.2f}; {options.steps} recorded steps per child")
    for _ in range(options.children):
        for side in ("training", "writer"):
            out = subprocess.run([sys.executable, __file__, "--child", side, "--steps", str(options.steps)],
                                 capture_output=True, text=True, check=True).stdout
            found = json.loads([line for line in out.splitlines() if line.startswith("RESULT ")][-1][7:])
            collections = ", ".join(f"{key}: {count} ({seconds * 1e3:.1f} ms)"
                                    for key, (count, seconds) in sorted(found["counts"].items()))
            print(f"  rows built on the {side:<9} thread CPU {found['thread_ms_per_step']:.3f} ms/step; "
                  f"collections {collections or 'none'}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
