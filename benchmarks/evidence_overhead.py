"""The cost of the run's evidence (issue 24): every-step sentinels and the runinfo table of recorded steps.

Two workloads, each with three variants side by side in one process, interleaved block by block (the order
rotates each round, so that drift on a shared machine hits them alike); every variant has its own model,
optimizer, data and recorder, all alike but for comgra's options:

  * before:    comgra as it was before the evidence (the recorder's evidence switched off: no sentinel, no
               runinfo row), recording as usual;
  * evidence:  the default: sentinels on every step (the losses and outputs), runinfo on recorded steps;
               target <= 1.03x of ``before``;
  * runinfo:   ``set_sentinels(enabled=False)``: the runinfo rows of recorded steps only.

Workloads: the tutorial (its recurrent network and schedule, FrequencyPerType(1000)), and a small GPT-2
(transformers, random weights; the documented loop registering the logits and the loss, 1 recorded step in 10).

Prints per workload and variant the median over the rounds of (block time / the round's ``before`` block), with
the lowest and highest round beside it, on the wall clock and on the process's CPU time.

    python benchmarks/evidence_overhead.py [--rounds 15] [--tutorial-steps 200] [--gpt-steps 10] [--threads 1]
    python benchmarks/evidence_overhead.py --workloads parts   # the sentinels alone, per step
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import comgra
from comgra.examples import tutorial
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder

VARIANTS = ("before", "evidence", "runinfo")
TARGET = 1.03


def _recorder(root: Path, trial: str, variant: str, every: int, **options: object) -> ComgraRecorder:
    recorder = ComgraRecorder(root, "bench", trial, DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=every), **options)  # type: ignore[arg-type]
    if variant == "before":
        recorder._evidence = None  # as comgra was before issue 24: no sentinel, no runinfo
    elif variant == "runinfo":
        recorder.set_sentinels(enabled=False)
    return recorder


class TutorialVariant:
    def __init__(self, root: Path, variant: str):
        options = tutorial._Options(10**9, 1000, 200, 0, torch.device("cpu"), False, True)
        self.recorder = _recorder(root, f"tutorial-{variant}", variant, 1000, max_num_batch_size_to_record=5,
                                  prefixes_for_grouping_module_parameters_visually=[
                                      f"main_model.{n}" for n in tutorial.SUBNETS],
                                  prefixes_for_grouping_module_parameters_in_nodes=[
                                      f"main_model.{n}" for n in tutorial.SUBNETS])
        self.model = tutorial._make_model(options, activate_output=False)
        self.recorder.track_module("main_model", self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=tutorial.LEARNING_RATE)
        self.recorder.track_optimizer(self.optimizer)
        self.generator = torch.Generator().manual_seed(0)
        self.step = 0

    def block(self, steps: int) -> None:
        comgra.my_recorder = self.recorder
        for _ in range(steps):
            batch = tutorial._make_batch(tutorial._pick_length(self.generator), self.generator, torch.device("cpu"))
            tutorial._training_step(self.model, self.optimizer, self.step, batch)
            self.step += 1


class GptVariant:
    def __init__(self, root: Path, variant: str, base: torch.nn.Module, options: argparse.Namespace):
        import copy

        self.recorder = _recorder(root, f"gpt-{variant}", variant, 10)
        self.model = copy.deepcopy(base)
        self.recorder.track_module("gpt", self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.recorder.track_optimizer(self.optimizer)
        self.generator = torch.Generator().manual_seed(0)
        self.options = options
        self.step = 0

    def block(self, steps: int) -> None:
        recorder, options = self.recorder, self.options
        for _ in range(steps):
            ids = torch.randint(0, options.vocab, (options.batch, options.seq), generator=self.generator)
            recorder.start_batch(self.step, options.batch)
            recorder.start_iteration()
            output = self.model(input_ids=ids, labels=ids)
            recorder.register_tensor("logits", output.logits)
            recorder.register_tensor("loss", output.loss, is_loss=True)
            output.loss.backward()
            recorder.record_current_gradients("gradients")
            self.optimizer.step()
            self.optimizer.zero_grad()
            recorder.finish_iteration()
            recorder.finish_batch()
            self.step += 1


def gpt2(options: argparse.Namespace) -> torch.nn.Module:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=options.n_layer, n_embd=options.n_embd, n_head=4, vocab_size=options.vocab,
                                     n_positions=options.seq, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def measure(name: str, variants: dict[str, Callable[[int], None]], steps: int, rounds: int) -> dict[str, float]:
    for block in variants.values():  # warm-up: the first recorded step's one-time costs, the allocator
        block(steps)
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    order = list(variants)
    for round_ in range(rounds):
        for variant in order[round_ % len(order):] + order[:round_ % len(order)]:
            start, start_cpu = time.perf_counter(), time.process_time()
            variants[variant](steps)
            times[variant].append((time.perf_counter() - start, time.process_time() - start_cpu))
    medians = {}
    print(f"\n{name}: {rounds} rounds of {steps} steps per variant (ratio to 'before' of the same round)")
    for variant in variants:
        for clock, index in (("wall", 0), ("cpu", 1)):
            ratios = [t[index] / b[index] for t, b in zip(times[variant], times["before"])]
            median = statistics.median(ratios)
            medians[f"{variant}/{clock}"] = median
            per_step = statistics.median(t[index] for t in times[variant]) / steps * 1e3
            flag = "" if variant == "before" else (" <= target" if median <= TARGET else f" > target {TARGET}")
            print(f"  {variant:9s} {clock:4s} {median:6.3f}x  (rounds {min(ratios):.3f}-{max(ratios):.3f})"
                  f"  {per_step:7.2f} ms/step{flag if clock == 'wall' and variant == 'evidence' else ''}")
    return medians


def sentinel_parts(options: argparse.Namespace) -> None:
    """The sentinels' own time per step, timed alone (the ratios above are within the noise of a shared machine):
    start_batch, the registration of a loss and an output of the workload's size, finish_batch, per step."""
    from comgra.breakpoints.sentinels import Sentinels

    shapes = {f"tutorial (output {tutorial.BATCH_SIZE}x{tutorial.NUM_SEQUENCES}, loss)": (tutorial.BATCH_SIZE, tutorial.NUM_SEQUENCES),
              f"GPT-2 (logits {options.batch}x{options.seq}x{options.vocab}, loss)": (options.batch, options.seq,
                                                                                       options.vocab)}
    print("\nsentinels alone, per training step (median of 5 runs of 2000 steps, CPU time):")
    for name, shape in shapes.items():
        output, loss = torch.randn(*shape), torch.randn(())
        sentinels = Sentinels(put=lambda table: None, warn=lambda key, message: None, note=lambda note: None)
        sentinels.outputs = {"out"}
        runs = []
        for _ in range(5):
            start = time.process_time()
            for step in range(2000):
                sentinels.start_batch(step, "training", shape[0], False)
                sentinels.register("out", output, False)
                sentinels.register("loss", loss, True)
                sentinels.finish_batch(pausable=False)
            runs.append((time.process_time() - start) / 2000)
        print(f"  {name}: {statistics.median(runs) * 1e6:.1f} us")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tutorial-steps", type=int, default=200)
    parser.add_argument("--gpt-steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--workloads", default="tutorial,gpt")
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)
    print(f"torch {torch.__version__}, {options.threads} thread(s), python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        if "tutorial" in options.workloads:
            runs = {v: TutorialVariant(root, v) for v in VARIANTS}
            measure("tutorial", {v: r.block for v, r in runs.items()}, options.tutorial_steps, options.rounds)
            for run in runs.values():
                run.recorder.finalize()
        sentinel_parts(options)
        if "gpt" in options.workloads:
            base = gpt2(options)
            gpts = {v: GptVariant(root, v, base, options) for v in VARIANTS}
            measure(f"GPT-2 ({options.n_layer} layers, n_embd {options.n_embd}, batch {options.batch}x{options.seq})",
                    {v: r.block for v, r in gpts.items()}, options.gpt_steps, options.rounds)
            for gpt in gpts.values():
                gpt.recorder.finalize()


if __name__ == "__main__":
    main()
