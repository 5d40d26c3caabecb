"""The cost of the Trainer and Lightning callbacks on steps that are not recorded, CPU.

For each framework, the same real ``Trainer`` on the same model (a GPT-2 built from a transformers config,
random weights) with and without ``ComgraCallback``:

  * none:       the Trainer without comgra (the baseline);
  * unrecorded: ``ComgraCallback(...)`` (``watch=True``, every module's output) with a policy that records no
                step: what every step that is not recorded costs; target: nothing measurable;
  * recording:  (with ``--variants``) the same callback, 1 recorded step in 10, for comparison.

The variants run side by side in one process, interleaved: each variant's ``trainer.train()`` / ``fit()``
runs in a thread of its own, and a baton (two callbacks of the benchmark: the first and the last in the
Trainer's list) lets one variant at a time run a block of ``--steps`` optimizer steps, so that the timed
block spans each step from its first callback to its last, with comgra's callbacks inside it. The order of
the variants rotates each round, so drift on a shared machine hits them alike. Printed per variant: the
median over the rounds of (block time / the round's ``none`` block), with the lowest and highest round, and
the median time per step, on the wall clock and on the running thread's CPU clock (comgra writes nothing on
an unrecorded step, so the training thread is where its cost would be); the median difference to ``none``
in ms per step; and the time spent inside comgra's callback methods and model hooks, each wrapped in a
timer (a direct measure of what the callback adds, which the noise of a shared machine does not blur), and
of that, the mean CPU time of the recorder's polls of its live-control files (time-based: every 0.5 s of
wall time, so their share per step grows as steps slow down on a loaded machine).

    python benchmarks/callback_overhead.py [--framework transformers,lightning] [--rounds 21] [--steps 10]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import transformers

from comgra.objects import DecisionMakerForRecordingsFrequencyPerType, DecisionMakerForRecordingsHardcoded


class Inside:
    """The time spent inside comgra's callback methods and model hooks (each wrapped in a timer), per block;
    of it, in the recorder's poll of its live-control files (BreakpointMonitor._poll: every
    ``[breakpoints] poll_interval_s``, 0.5 s by default, of wall time, not per step)."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.poll_cpu = 0.0
        self.blocks: list[tuple[float, float]] = []
        self.polls: list[float] = []
        self.calls: dict[str, list[float]] = {}  # CPU seconds of each call, per method

    def wrap(self, callback: Any, names: tuple[str, ...]) -> Any:
        for name in names:
            setattr(callback, name, self._timed(getattr(callback, name), self.calls.setdefault(name, [])))
        return callback

    def _timed(self, method: Any, calls: list[float]) -> Any:
        def timed(*arguments: Any, **kwargs: Any) -> Any:
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return method(*arguments, **kwargs)
            finally:
                cpu = time.thread_time() - start_cpu
                self.wall += time.perf_counter() - start
                self.cpu += cpu
                calls.append(cpu)
        return timed

    def end_block(self) -> None:
        self.blocks.append((self.wall, self.cpu))
        self.polls.append(self.poll_cpu)
        self.wall = self.cpu = self.poll_cpu = 0.0


INSIDE_OF_THREAD: dict[int, Inside] = {}


def time_the_polls() -> None:
    """Wrap BreakpointMonitor._poll in a timer that charges the running variant (by thread)."""
    from comgra.breakpoints.monitor import BreakpointMonitor

    poll = BreakpointMonitor._poll

    def timed(self: Any) -> None:
        start = time.thread_time()
        try:
            poll(self)
        finally:
            inside = INSIDE_OF_THREAD.get(threading.get_ident())
            if inside is not None:
                inside.poll_cpu += time.thread_time() - start

    BreakpointMonitor._poll = timed  # type: ignore[method-assign]


# What a Trainer calls of each callback on a training step (and the model hooks the Trainer callback adds).
HF_METHODS = ("on_step_begin", "_before_model", "_after_model", "on_substep_end", "on_pre_optimizer_step",
              "on_step_end", "on_log")
PL_METHODS = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")


class Baton:
    """Lets a variant's training thread run one block of steps when told to, and times it."""

    def __init__(self, steps: int):
        self.steps, self.done_steps = steps, 0
        self.inside = Inside()
        self.go, self.done = threading.Event(), threading.Event()
        self.started = (0.0, 0.0)
        self.times: list[tuple[float, float]] = []

    def step_begins(self) -> None:
        if self.done_steps == 0:
            self.go.wait()
            self.go.clear()
            self.started = (time.perf_counter(), time.thread_time())

    def step_ends(self) -> None:
        self.done_steps += 1
        if self.done_steps == self.steps:
            self.times.append((time.perf_counter() - self.started[0], time.thread_time() - self.started[1]))
            self.inside.end_block()
            self.done_steps = 0
            self.done.set()

    def run_block(self) -> tuple[float, float]:
        self.done.clear()
        self.go.set()
        self.done.wait()
        return self.times[-1]


def gpt2(options: argparse.Namespace) -> torch.nn.Module:
    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=options.layers, n_embd=options.n_embd, n_head=4, vocab_size=options.vocab,
                                     n_positions=options.seq, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def policy(variant: str) -> Any:
    return DecisionMakerForRecordingsHardcoded(set()) if variant == "unrecorded" else \
        DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10)


def transformers_runner(variant: str, model: torch.nn.Module, data: list[dict[str, Any]], baton: Baton, root: Path,
                        total_steps: int, options: argparse.Namespace) -> Any:
    from comgra.integrations.transformers import ComgraCallback

    class Start(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *arguments: Any, **kwargs: Any) -> None:
            baton.step_begins()

    class End(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *arguments: Any, **kwargs: Any) -> None:
            baton.step_ends()

    callbacks: list[Any] = [Start()]
    if variant != "none":
        callbacks.append(baton.inside.wrap(ComgraCallback(root, "bench-hf", variant, policy(variant)), HF_METHODS))
    callbacks.append(End())
    args = transformers.TrainingArguments(
        output_dir=str(root / f"hf-{variant}"), per_device_train_batch_size=options.batch, max_steps=total_steps,
        learning_rate=1e-3, optim="sgd", lr_scheduler_type="constant", use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    return trainer.train


def lightning_runner(variant: str, model: torch.nn.Module, data: list[dict[str, Any]], baton: Baton, root: Path,
                     total_steps: int, options: argparse.Namespace) -> Any:
    import lightning

    from comgra.integrations.lightning import ComgraCallback

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss  # type: ignore[no-any-return]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    class Start(lightning.Callback):
        def on_train_batch_start(self, *arguments: Any) -> None:
            baton.step_begins()

    class End(lightning.Callback):
        def on_train_batch_end(self, *arguments: Any) -> None:
            baton.step_ends()

    callbacks: list[Any] = [Start()]
    if variant != "none":
        callbacks.append(baton.inside.wrap(ComgraCallback(root, "bench-pl", variant, policy(variant)), PL_METHODS))
    callbacks.append(End())
    trainer = lightning.Trainer(default_root_dir=str(root / f"pl-{variant}"), accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                max_steps=total_steps, callbacks=callbacks)
    loader = torch.utils.data.DataLoader(data, batch_size=options.batch, shuffle=False)
    module = Module()
    return lambda: trainer.fit(module, loader)


def measure(framework: str, names: list[str], options: argparse.Namespace) -> dict[str, Baton]:
    base = gpt2(options)
    generator = torch.Generator().manual_seed(0)
    total_steps = (options.rounds + 1) * options.steps  # one warm-up block
    ids = torch.randint(0, options.vocab, (total_steps * options.batch, options.seq), generator=generator)
    data = [{"input_ids": row, "labels": row} for row in ids]
    make = transformers_runner if framework == "transformers" else lightning_runner
    with tempfile.TemporaryDirectory() as directory:
        batons = {name: Baton(options.steps) for name in names}
        threads = []
        for name in names:
            run = make(name, copy.deepcopy(base), data, batons[name], Path(directory), total_steps, options)
            threads.append(threading.Thread(target=_registered(run, batons[name].inside), name=f"{framework}-{name}",
                                            daemon=True))
        for thread in threads:
            thread.start()
        for name in names:  # the first block of each: set-up, the allocator's warm-up, first-step costs
            batons[name].run_block()
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for round_ in range(options.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                times[name].append(batons[name].run_block())
        for thread in threads:
            thread.join(timeout=120)
    for name in names:  # the timed rounds only, not the warm-up block
        batons[name].times = times[name]
        batons[name].inside.blocks = batons[name].inside.blocks[1:]
        batons[name].inside.polls = batons[name].inside.polls[1:]
    return batons


def _registered(run: Any, inside: Inside) -> Any:
    def target() -> None:
        INSIDE_OF_THREAD[threading.get_ident()] = inside
        run()
    return target


def report(framework: str, names: list[str], batons: dict[str, Baton], options: argparse.Namespace) -> None:
    print(f"\n{framework}: GPT-2, {options.layers} layers, n_embd={options.n_embd}, batch {options.batch} x {options.seq} "
          f"tokens, {torch.get_num_threads()} torch thread(s); {options.rounds} rounds of {options.steps} steps per variant")
    none = batons["none"].times
    for clock, index in (("wall clock", 0), ("training thread's CPU time", 1)):
        print(f"  {clock}:\n  {'variant':<12}{'ms/step':>10}{'ratio':>9}  {'rounds (min-max)':<18}"
              f"{'difference ms/step':>20}{'in comgra ms/step':>19}{'of it polls':>13}")
        for name in names:
            measured = [t[index] for t in batons[name].times]
            per_step = statistics.median(measured) / options.steps * 1000
            if name == "none":
                print(f"  {name:<12}{per_step:>10.2f}")
                continue
            ratios = [t / n[index] for t, n in zip(measured, none)]
            differences = [(t - n[index]) / options.steps * 1000 for t, n in zip(measured, none)]
            inside = statistics.median(b[index] for b in batons[name].inside.blocks) / options.steps * 1000
            polls = "" if index == 0 else f"{statistics.mean(batons[name].inside.polls) / options.steps * 1000:>13.3f}"
            print(f"  {name:<12}{per_step:>10.2f}{statistics.median(ratios):>8.3f}x  "
                  f"{min(ratios):.3f}-{max(ratios):.3f}x{'':<6}{statistics.median(differences):>+20.3f}{inside:>19.3f}"
                  f"{polls}")
    for name in names[1:]:
        calls = {method: times[options.steps:] for method, times in batons[name].inside.calls.items()
                 if len(times) > options.steps}  # the methods called on every step
        print(f"  {name}: CPU per call inside comgra, median (the warm-up block left out): " + ", ".join(
            f"{method} {statistics.median(times) * 1e6:.1f} us" for method, times in calls.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", default="transformers,lightning")
    parser.add_argument("--variants", default="none,unrecorded")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per block")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    options = parser.parse_args()
    names = options.variants.split(",")
    if names[0] != "none":
        parser.error("--variants must start with none (the baseline)")
    torch.set_num_threads(options.threads)
    warnings.filterwarnings("ignore")  # the frameworks' advice about a tiny CPU setup
    time_the_polls()
    for framework in options.framework.split(","):
        report(framework, names, measure(framework, names, options), options)


if __name__ == "__main__":
    main()
