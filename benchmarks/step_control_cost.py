"""What abandon_step's bookkeeping adds to a step the policy does not record, side by side in one process.

``start_batch`` notes the step it leaves (for ``abandon_step``) and checks that no newer recorder replaced
this one (``capture.step_control.opened``). Variants, interleaved block by block: ``shipped`` (as is) and
``without`` (``opened`` replaced by a function that does nothing: the recorder before it). A step is
start_batch, start_iteration, one register_tensor, finish_iteration, finish_batch, on a step the policy
does not record. Prints the median microseconds per step of each and their ratio, and the same for the
fastest block of each (on a busy machine the least disturbed measurement).

    OMP_NUM_THREADS=1 python benchmarks/step_control_cost.py [--rounds 15] [--steps 4000]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=4000)
    args = parser.parse_args()
    import torch

    from comgra.capture import step_control
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder

    shipped = step_control.opened

    def without(recorder: object) -> None:
        return None

    tensor = torch.ones(8, 4)
    timings: dict[str, list[float]] = {"shipped": [], "without": []}
    with tempfile.TemporaryDirectory() as folder:
        policy = DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10 ** 9)
        recorder = ComgraRecorder(folder, "cost", "cost", policy)
        recorder.start_batch(0, 8)  # the first step is recorded: out of the way before timing
        recorder.finish_batch()
        step = 1
        for _ in range(args.rounds):
            for name, opened in (("shipped", shipped), ("without", without)):
                step_control.opened = opened
                start = time.perf_counter()
                for _ in range(args.steps):
                    recorder.start_batch(step, 8)
                    recorder.start_iteration()
                    recorder.register_tensor("x", tensor)
                    recorder.finish_iteration()
                    recorder.finish_batch()
                    step += 1
                timings[name].append((time.perf_counter() - start) / args.steps * 1e6)
        step_control.opened = shipped
        recorder.finalize()
    medians = {name: statistics.median(values) for name, values in timings.items()}
    print(f"an unrecorded step, microseconds (median of {args.rounds} interleaved blocks of {args.steps} steps)")
    for name, value in medians.items():
        print(f"  {name:<8} {value:8.3f} us  (blocks: {min(timings[name]):.3f}-{max(timings[name]):.3f})")
    print(f"  shipped / without: {medians['shipped'] / medians['without']:.3f}x, "
          f"+{medians['shipped'] - medians['without']:.3f} us per step")
    fastest = {name: min(values) for name, values in timings.items()}  # the least disturbed block of each
    print(f"  fastest blocks, shipped / without: {fastest['shipped'] / fastest['without']:.3f}x, "
          f"+{fastest['shipped'] - fastest['without']:.3f} us per step")


if __name__ == "__main__":
    main()
