"""The cost of ``comgra.watch`` on a 12-layer GPT-2 (built from a transformers config, random weights), CPU.

Variants, side by side in one process, interleaved block by block (the order rotates each round, so
drift on a shared machine hits them alike); each block is ``--steps`` training steps of the same model:

  * none:      no comgra at all (the baseline);
  * recording: ``comgra.watch(model)`` and the documented loop, 1 recorded step in 10
               (DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10)); target <= 1.10x;
  * unrecorded: the same hooks and calls, a policy that records no step (every hook returns at once);
               target <= 1.02x;
  * off:       the same code with ComgraRecorder(comgra_is_active=False) (watch installs no hook); target <= 1.02x.

Prints per variant, on two clocks, the median over the rounds of (block time / the round's none block),
with the lowest and highest round beside it, and the median time per step: the wall clock, and the
process's CPU time (all its threads: torch's, and comgra's writer and statistics threads), which other
processes on a shared machine disturb far less.

    python benchmarks/watch_overhead.py [--rounds 15] [--steps 10] [--threads 1] [--n-embd 128] [--batch 8] [--seq 64]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers

import comgra
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType, DecisionMakerForRecordingsHardcoded
from comgra.recorder import ComgraRecorder

TARGETS = {"recording": 1.10, "unrecorded": 1.02, "off": 1.02}


class Variant:
    """One model, its optimizer and (but for ``none``) its recorder, trained block by block."""

    def __init__(self, name: str, model: torch.nn.Module, root: Path, options: argparse.Namespace):
        self.name, self.model, self.options = name, model, options
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        self.step = 0
        self.recorder: ComgraRecorder | None = None
        if name != "none":
            policy = DecisionMakerForRecordingsHardcoded(set()) if name == "unrecorded" else \
                DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10)
            self.recorder = ComgraRecorder(root, "bench", name, policy, comgra_is_active=name != "off")
            comgra.watch(model, recorder=self.recorder, name="gpt")  # the one line

    def block(self, batches: list[torch.Tensor]) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) of one block of training steps."""
        start, start_cpu = time.perf_counter(), time.process_time()
        for ids in batches:
            self.train_step(ids)
        return time.perf_counter() - start, time.process_time() - start_cpu

    def train_step(self, ids: torch.Tensor) -> None:
        recorder = self.recorder
        if recorder is not None:
            recorder.start_batch(self.step, ids.shape[0])
            recorder.start_iteration()
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        if recorder is not None:
            recorder.record_current_gradients("gradients")
        self.optimizer.step()
        self.optimizer.zero_grad()
        if recorder is not None:
            recorder.finish_iteration()
            recorder.finish_batch()
        self.step += 1


def gpt2(options: argparse.Namespace) -> torch.nn.Module:
    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=12, n_embd=options.n_embd, n_head=options.n_head,
                                     vocab_size=options.vocab, n_positions=options.seq, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine's other core is left "
                        "to comgra's background threads and to other processes)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per block (10: one recorded step)")
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--variants", default="none,recording,unrecorded,off")
    options = parser.parse_args()
    names = options.variants.split(",")
    torch.set_num_threads(options.threads)
    base = gpt2(options)
    generator = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as root:
        variants = [Variant(name, copy.deepcopy(base), Path(root), options) for name in names]
        warm = [torch.randint(0, options.vocab, (options.batch, options.seq), generator=generator) for _ in range(options.steps)]
        for variant in variants:  # the first recorded step's one-time costs and the allocator's warm-up
            variant.block(warm)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for round_ in range(options.rounds):
            batches = [torch.randint(0, options.vocab, (options.batch, options.seq), generator=generator)
                       for _ in range(options.steps)]
            order = variants[round_ % len(variants):] + variants[:round_ % len(variants)]
            for variant in order:
                times[variant.name].append(variant.block(batches))
        for variant in variants:
            if variant.recorder is not None:
                variant.recorder.finalize()
    parameters = sum(p.numel() for p in base.parameters())
    print(f"GPT-2, 12 layers, n_embd={options.n_embd}, {parameters / 1e6:.1f}M parameters, batch {options.batch} x "
          f"{options.seq} tokens, {torch.get_num_threads()} torch threads; {options.rounds} rounds of "
          f"{options.steps} steps per variant")
    for clock, index in (("wall clock", 0), ("process CPU time", 1)):
        print(f"\n{clock}:\n{'variant':<12}{'ms/step':>10}{'ratio':>9}  {'rounds (min-max)':<18}target")
        for name in names:
            measured = [t[index] for t in times[name]]
            per_step = statistics.median(measured) / options.steps * 1000
            if "none" not in times or name == "none":
                print(f"{name:<12}{per_step:>10.1f}")
                continue
            ratios = [t / n[index] for t, n in zip(measured, times["none"])]
            ratio, target = statistics.median(ratios), TARGETS.get(name)
            verdict = "" if target is None else f"<= {target:.2f}x: {'met' if ratio <= target else 'NOT met'}"
            print(f"{name:<12}{per_step:>10.1f}{ratio:>8.3f}x  {min(ratios):.3f}-{max(ratios):.3f}x{'':<6}{verdict}")


if __name__ == "__main__":
    main()
