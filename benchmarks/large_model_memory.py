"""Host memory while recording a ResNet-50-sized model, and what the recorder keeps per tensor.

ResNet-50 (benchmarks/recording_workloads.py: 25.6M parameters in 161 tensors, the largest 2.4M
elements; activations of 1M elements per tensor at the default input) is trained for a few steps
in a fresh process per mode, interleaved round by round:

  * none: without comgra;
  * inactive: comgra imported and a recorder made with comgra_is_active=False (the fixed cost of
    importing the recorder's dependencies);
  * all: recording every step, every BatchNorm-3 and block output registered with the default
    'neuron' recording type (the widest the recorder stores), parameters and gradients included.

Prints the peak resident memory of each (``ru_maxrss``), the resident memory after every step (it
must stay flat), and, read back from the recording: the values kept per tensor and sample against
the tensor's size (the cap is ``max_num_neurons_to_record``), rows and bytes per recorded step.

    python benchmarks/large_model_memory.py [--rounds 3] [--steps 6]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from process_memory import resident_mib  # noqa: E402


def train(mode: str, steps: int, out: Path, batch: int, size: int, max_neurons: int) -> dict:
    import torch
    import torch.nn.functional as F
    from recording_workloads import Bottleneck, ResNet

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = ResNet(Bottleneck, (3, 4, 6, 3), classes=1000)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rec = None
    if mode != "none":
        from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
        from comgra.recorder import ComgraRecorder
        rec = ComgraRecorder(str(out), "large", "resnet50", DecisionMakerForRecordingsFrequencyPerType(1),
                             max_num_batch_size_to_record=batch, comgra_is_active=mode == "all",
                             max_num_neurons_to_record=max_neurons)
        rec.track_module("resnet50", model)

    def observe(name, tensor):
        if rec and not name.endswith("_bn3"):  # block outputs and the stem: the largest activations
            rec.register_tensor(name, tensor)

    after_step, start = [], time.perf_counter()
    for step in range(steps):
        images, labels = torch.randn(batch, 3, size, size), torch.randint(0, 1000, (batch,))
        if rec:
            rec.start_batch(step, batch)
            rec.start_iteration()
            rec.register_tensor("images", images, is_input=True)
        logits = model(images, observe)
        loss = F.cross_entropy(logits, labels)
        if rec:
            rec.register_tensor("logits", logits)
            rec.register_tensor("loss", loss, is_loss=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rec:
            rec.record_current_gradients("gradients")
            rec.finish_iteration()
            rec.finish_batch()
        after_step.append(round(resident_mib(), 1))
    if rec:
        rec.finalize()
    return {"mode": mode, "seconds": time.perf_counter() - start, "after_step_mib": after_step,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "parameters": sum(p.numel() for p in model.parameters()),
            "parameter_tensors": len(list(model.parameters())),
            "largest_parameter": max(p.numel() for p in model.parameters())}


def stored(out: Path, max_neurons: int) -> dict:
    import duckdb
    tensors = str(out / "large" / "trials" / "resnet50" / "tensors" / "*.parquet")
    query = (f"SELECT count(*), count(DISTINCT training_step), max(len(neurons)), max(num_neurons), "
             f"count_if(len(neurons) > {max_neurons}) FROM read_parquet('{tensors}')")
    rows, steps, kept, largest, over = duckdb.sql(query).fetchall()[0]
    size = sum(p.stat().st_size for p in (out / "large").rglob("*") if p.is_file())
    return {"rows": rows, "recorded_steps": steps, "most_values_kept": kept, "largest_tensor_values": largest,
            "rows_over_the_cap": over, "bytes": size}


def fresh_process(mode: str, args: argparse.Namespace, out: Path) -> dict:
    command = [sys.executable, __file__, "--worker", mode, "--steps", str(args.steps), "--out", str(out),
               "--batch", str(args.batch), "--size", str(args.size), "--max-neurons", str(args.max_neurons)]
    completed = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=128, help="image side: 128 gives 1M-element activations")
    parser.add_argument("--max-neurons", type=int, default=256, help="max_num_neurons_to_record (the default)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(train(args.worker, args.steps, args.out, args.batch, args.size, args.max_neurons)))
        return
    peaks: dict[str, list[float]] = {"none": [], "inactive": [], "all": []}
    for _ in range(args.rounds):
        for mode in peaks:
            with tempfile.TemporaryDirectory() as folder:
                result = fresh_process(mode, args, Path(folder))
                peaks[mode].append(result["peak_mib"])
                print(f"{mode:<8} peak {result['peak_mib']:7.1f} MiB  {result['seconds']:6.1f} s  "
                      f"RSS after each step: {result['after_step_mib']}", flush=True)
                if mode == "all":
                    store = stored(Path(folder), args.max_neurons)
    print(f"\nResNet-50: {result['parameters'] / 1e6:.1f}M parameters in {result['parameter_tensors']} tensors, "
          f"largest {result['largest_parameter']:,} values; batch {args.batch}, {args.size}x{args.size} images")
    for mode, values in peaks.items():
        print(f"peak RSS {mode:<8}: median {statistics.median(values):7.1f} MiB (spread {min(values):.1f}-{max(values):.1f})")
    none, inactive, recording = (statistics.median(peaks[mode]) for mode in ("none", "inactive", "all"))
    print(f"recording adds {recording - none:.1f} MiB ({recording / none:.3f}x) to the peak without comgra, "
          f"{recording - inactive:.1f} MiB over the recorder present but inactive")
    print(f"stored: {store['rows']} rows over {store['recorded_steps']} recorded steps, "
          f"{store['bytes'] / max(1, store['recorded_steps']) / 1024:.0f} KiB per recorded step; at most "
          f"{store['most_values_kept']} values kept per tensor and sample (cap {args.max_neurons}) for tensors of up "
          f"to {store['largest_tensor_values']:,} values; rows over the cap: {store['rows_over_the_cap']}")


if __name__ == "__main__":
    main()
