"""The tutorial task: a small recurrent network with a subtle bug, recorded with comgra.

The task is built to be easy to understand and to test length generalisation. The input is a
sequence of N tuples of 5 numbers in [-1, 1], read as 5 independent sequences. The target holds
5 numbers: 1 where the sum of that sequence is positive, else 0.

The network reads one tuple per iteration. Three small MLPs make it up: ``subnet_pre`` turns the
input and the memory into a hidden state, ``subnet_mem`` turns the hidden state into the next
memory, and ``subnet_out`` turns the last hidden state into 5 logits, which go through a sigmoid.

Two trials are trained on the same data from the same initial weights:

* ``trial_bugged_original_version`` applies leaky ReLU (negative slope 0.01) after every layer,
  the last layer of each subnet included, so negative outputs are learned at 1 % of the rate.
* ``trial_no_activation_function_on_output_layer`` leaves the last layer of each subnet linear.

Sequences of 1 to 10 tuples are used for training; 15 and 20 only test length generalisation and
never update the weights. Every step is tagged ``type_of_execution=f"{n:02d}_iterations"`` so
that each length gets recorded regularly. Open the result with ``comgra --path <group folder>``.

This module uses only the API documented for the original Comgra, so it runs with either.

>>> from pathlib import Path
>>> run_tutorial(Path("/tmp/comgra_demo"), steps=50, progress=False)  # doctest: +SKIP
PosixPath('/tmp/comgra_demo/testcase_for_demonstration')
"""
from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

import comgra

if TYPE_CHECKING:
    from comgra.recorder import ComgraRecorder

__all__ = ["TRIALS", "TRIAL_BUGGED", "TRIAL_FIXED", "SequenceSumNetwork", "run_tutorial"]

TRIAL_BUGGED = "trial_bugged_original_version"
TRIAL_FIXED = "trial_no_activation_function_on_output_layer"
TRIALS = (TRIAL_BUGGED, TRIAL_FIXED)

NUM_SEQUENCES = 5
MEMORY_SIZE = 50
BATCH_SIZE = 128
NEGATIVE_SLOPE = 0.01
LEARNING_RATE = 1e-3
TRAINING_LENGTHS = tuple(range(1, 11))
TEST_LENGTHS = (15, 20)
SUBNETS = ("subnet_pre", "subnet_mem", "subnet_out")
# Roles of the helper node: sums of the inputs seen so far, of those still to come, and of all.
HELPER_ROLES = ("partial_sums", "remaining_sums", "final_sums")


@dataclasses.dataclass(frozen=True)
class _Options:
    steps: int
    min_training_steps_difference: int
    hidden_size: int
    seed: int
    device: torch.device
    progress: bool
    record: bool
    profile: bool = False


class SubNet(nn.Module):
    """Two linear layers; ``activate_output`` puts leaky ReLU after the second one too (the bug)."""

    def __init__(self, in_features: int, hidden_size: int, out_features: int, *, activate_output: bool):
        super().__init__()
        self.layer_in = nn.Linear(in_features, hidden_size)
        self.layer_out = nn.Linear(hidden_size, out_features)
        self.activate_output = activate_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer_out(F.leaky_relu(self.layer_in(x), NEGATIVE_SLOPE))
        return F.leaky_relu(out, NEGATIVE_SLOPE) if self.activate_output else out


class SequenceSumNetwork(nn.Module):
    """The recurrent network; it registers its intermediate tensors with ``comgra.my_recorder``."""

    def __init__(self, hidden_size: int = 200, *, activate_output: bool):
        super().__init__()

        def subnet(in_features: int, out_features: int) -> SubNet:
            return SubNet(in_features, hidden_size, out_features, activate_output=activate_output)

        self.subnet_pre = subnet(NUM_SEQUENCES + MEMORY_SIZE, hidden_size)
        self.subnet_mem = subnet(hidden_size, MEMORY_SIZE)
        self.subnet_out = subnet(hidden_size, NUM_SEQUENCES)

    def step(self, x: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One iteration: returns the hidden state and the memory for the next iteration."""
        hidden_state = self.subnet_pre(torch.cat([x, memory], dim=1))
        comgra.my_recorder.register_tensor("subnet_pre__hidden_state", hidden_state)
        memory = self.subnet_mem(hidden_state)
        comgra.my_recorder.register_tensor("subnet_mem__memory", memory)
        return hidden_state, memory

    def readout(self, hidden_state: torch.Tensor) -> torch.Tensor:
        """The probability that each of the 5 sums is positive."""
        out = self.subnet_out(hidden_state)
        comgra.my_recorder.register_tensor("subnet_out__out", out)
        output = torch.sigmoid(out)
        comgra.my_recorder.register_tensor("output", output)
        return output


def run_tutorial(
    path: Path,
    group: str = "testcase_for_demonstration",
    *,
    steps: int = 20000,
    min_training_steps_difference: int = 1000,
    hidden_size: int = 200,
    seed: int = 0,
    trials: tuple[str, ...] = TRIALS,
    device: str = "cpu",
    progress: bool = True,
    record: bool = True,
    profile: bool = False,
) -> Path:
    """Train the tutorial trials, record them under ``path / group`` and return that folder.

    The same seed gives the same data and the same initial weights in every trial, so the trials
    differ only in the bug. ``record=False`` trains identically with comgra switched off, which
    measures what recording costs. ``profile=True`` also profiles the network's layers on every step (time,
    memory, FLOPs: the app's Profile tab; ``comgra demo`` does).
    """
    unknown = [trial for trial in trials if trial not in TRIALS]
    if unknown:
        raise ValueError(f"Unknown trial(s) {unknown}; choose from {list(TRIALS)}.")
    options = _Options(
        steps, min_training_steps_difference, hidden_size, seed, torch.device(device), progress, record, profile
    )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)  # the original Comgra requires the root to exist
    previous_recorder = getattr(comgra, "my_recorder", None)  # the original Comgra only declares it
    report = _Progress(options.steps * len(trials), enabled=options.progress)
    try:
        for trial in trials:
            _train_trial(path, group, trial, options, report)
    finally:
        report.close()
        comgra.my_recorder = previous_recorder  # type: ignore[assignment]  # None if there was none
    return path / group


def _train_trial(path: Path, group: str, trial: str, options: _Options, report: _Progress) -> None:
    """Train one trial from scratch, with its own recorder."""
    recorder = _make_recorder(path, group, trial, options)
    comgra.my_recorder = recorder
    model = _make_model(options, activate_output=trial == TRIAL_BUGGED)
    recorder.track_module("main_model", model, profile=options.profile)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(options.seed)
    recorder.add_note(_describe_trial(trial, options))
    log = _LossLog()
    note_every = max(1, options.steps // 20)
    for step in report.steps(options.steps, trial):
        length = _pick_length(generator)
        batch = _make_batch(length, generator, options.device)
        loss, accuracy = _training_step(model, optimizer, step, batch)
        log.add(length, loss, accuracy)
        if (step + 1) % note_every == 0 or step + 1 == options.steps:
            recorder.add_note(log.pop_summary(step))
    recorder.finalize()


def _make_recorder(path: Path, group: str, trial: str, options: _Options) -> ComgraRecorder:
    """A recorder that keeps 5 samples per batch and records each length every so many steps."""
    # Imported here so that importing the example does not load the recording machinery.
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder

    subnet_prefixes = [f"main_model.{name}" for name in SUBNETS]
    return ComgraRecorder(
        comgra_root_path=path,
        group=group,
        trial_id=trial,
        decision_maker_for_recordings=DecisionMakerForRecordingsFrequencyPerType(
            min_training_steps_difference=options.min_training_steps_difference
        ),
        max_num_batch_size_to_record=5,
        # One node per subnet in the dependency graph, its 4 parameters being the roles of that node.
        prefixes_for_grouping_module_parameters_visually=subnet_prefixes,
        prefixes_for_grouping_module_parameters_in_nodes=subnet_prefixes,
        comgra_is_active=options.record,
    )


def _make_model(options: _Options, *, activate_output: bool) -> SequenceSumNetwork:
    """Initial weights depend on the seed only, without touching the caller's global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(options.seed)
        model = SequenceSumNetwork(options.hidden_size, activate_output=activate_output)
    return model.to(options.device)


@dataclasses.dataclass(frozen=True)
class _Batch:
    inputs: torch.Tensor  # (length, batch, 5), uniform in [-1, 1]
    target: torch.Tensor  # (batch, 5): 1.0 where the sequence sums to more than 0

    @property
    def length(self) -> int:
        return self.inputs.shape[0]


def _pick_length(generator: torch.Generator) -> int:
    lengths = TRAINING_LENGTHS + TEST_LENGTHS
    return lengths[int(torch.randint(len(lengths), (), generator=generator))]


def _make_batch(length: int, generator: torch.Generator, device: torch.device) -> _Batch:
    # Drawn on the CPU so that a seed gives the same data on every device.
    inputs = torch.rand(length, BATCH_SIZE, NUM_SEQUENCES, generator=generator) * 2 - 1
    target = (inputs.sum(dim=0) > 0).float()
    return _Batch(inputs.to(device), target.to(device))


def _training_step(
    model: SequenceSumNetwork, optimizer: torch.optim.Optimizer, step: int, batch: _Batch
) -> tuple[float, float]:
    """One step; test lengths never update the weights. Returns the loss and the accuracy."""
    recorder = comgra.my_recorder
    recorder.start_batch(step, BATCH_SIZE, type_of_execution=f"{batch.length:02d}_iterations")
    is_test = batch.length in TEST_LENGTHS
    # A test step needs autograd only when comgra records it, so that its gradients can be inspected.
    backward = not is_test or recorder.recording_is_active()
    optimizer.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(backward):
        loss, output = _forward_sequence(model, batch, backward=backward)
    if not is_test:
        optimizer.step()
    loss_value = loss.item()
    accuracy = ((output.detach() > 0.5) == (batch.target > 0.5)).float().mean().item()
    # Every step, not only recorded ones, so that the curves are dense.
    for group, name, value in (("loss", "bce", loss_value), ("accuracy", "per_sequence", accuracy)):
        recorder.record_kpi_in_graph(group, name, value, record_even_if_recording_is_inactive=True)
    recorder.finish_batch()
    return loss_value, accuracy


def _forward_sequence(
    model: SequenceSumNetwork, batch: _Batch, *, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run all iterations; the memory of one iteration feeds the next. Returns loss and output."""
    recorder = comgra.my_recorder
    memory = torch.zeros(BATCH_SIZE, MEMORY_SIZE, device=batch.inputs.device)
    recorder.register_tensor("initial_memory", memory, is_initial_value=True)
    partial_sums = batch.inputs.cumsum(dim=0)
    for iteration in range(batch.length):
        recorder.start_iteration()
        # A fresh tensor per iteration: comgra marks registered tensors as requiring gradients.
        x = batch.inputs[iteration].clone()
        recorder.register_tensor("input", x, is_input=True)
        _register_helpers(partial_sums, iteration)
        hidden_state, memory = model.step(x, memory)
        if iteration == batch.length - 1:
            loss, output = _loss_on_last_iteration(model, hidden_state, batch.target, backward=backward)
        recorder.finish_iteration()
    return loss, output


def _register_helpers(partial_sums: torch.Tensor, iteration: int) -> None:
    """Debugging aids the network never sees: one node, ``helper_partial_sums``, with three roles."""
    if not comgra.my_recorder.recording_is_active():
        return
    so_far, final = partial_sums[iteration], partial_sums[-1]
    values = {"partial_sums": so_far, "remaining_sums": final - so_far, "final_sums": final}
    for role in HELPER_ROLES:
        comgra.my_recorder.register_tensor(
            f"helper_partial_sums__{role}",
            values[role].clone(),
            node_name="helper_partial_sums",
            role_within_node=role,
        )
        # Computed from the inputs outside autograd's view: this edge says so (and the recorder does not
        # warn that the helper is connected to nothing).
        comgra.my_recorder.add_tensor_connection("input", f"helper_partial_sums__{role}")


def _loss_on_last_iteration(
    model: SequenceSumNetwork, hidden_state: torch.Tensor, target: torch.Tensor, *, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read out, compute the loss, and record the gradients while the iteration is still open."""
    recorder = comgra.my_recorder
    output = model.readout(hidden_state)
    recorder.register_tensor("target", target, is_target=True)
    # One value per sample, so that hard samples can be compared with helper_partial_sums.
    # Shape (batch, 1): the original Comgra refuses a tensor without a value dimension.
    loss_per_sample = F.binary_cross_entropy(output, target, reduction="none").mean(dim=1, keepdim=True)
    recorder.register_tensor("loss_per_sample", loss_per_sample)
    loss = loss_per_sample.mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    if backward:
        loss.backward()
        recorder.record_current_gradients("gradients")
    return loss, output


def _describe_trial(trial: str, options: _Options) -> str:
    bugged = trial == TRIAL_BUGGED
    bug = "after every layer, the output layers included" if bugged else "on hidden layers only"
    return (
        f"{trial}: leaky ReLU (slope {NEGATIVE_SLOPE}) {bug}; hidden size {options.hidden_size}, "
        f"memory {MEMORY_SIZE}, batch {BATCH_SIZE}, {options.steps} steps, seed {options.seed}. "
        f"Training lengths {TRAINING_LENGTHS[0]}-{TRAINING_LENGTHS[-1]}, test lengths {list(TEST_LENGTHS)}."
    )


class _LossLog:
    """Running means for the periodic notes, kept apart for training and for each test length."""

    def __init__(self) -> None:
        self._sums: dict[str, list[float]] = {}

    def add(self, length: int, loss: float, accuracy: float) -> None:
        key = "training" if length in TRAINING_LENGTHS else f"{length} iterations"
        sums = self._sums.setdefault(key, [0.0, 0.0, 0])
        sums[0] += loss
        sums[1] += accuracy
        sums[2] += 1

    def pop_summary(self, step: int) -> str:
        parts = [
            f"{key}: loss {loss / count:.4f}, accuracy {accuracy / count:.3f}"
            for key, (loss, accuracy, count) in sorted(self._sums.items())
        ]
        self._sums.clear()
        return f"step {step}: " + "; ".join(parts)


class _Progress:
    """The progress over all trials on stderr: a bar with an estimate of the time left on a terminal
    (redrawn at most 5 times a second), elsewhere (a log, a pipe) a line every ``LINE_SECONDS``."""

    LINE_SECONDS = 5.0
    WIDTH = 30

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.done = 0
        self.start = time.perf_counter()
        self.shown = float("-inf")
        self.terminal = enabled and sys.stderr.isatty()

    def steps(self, steps: int, trial: str) -> Iterator[int]:
        for step in range(steps):
            yield step
            self.done += 1
            if self.enabled:
                self._show(trial, final=step + 1 == steps)

    def line(self, trial: str) -> str:
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        estimate = f", about {left:.0f} s left" if self.done < self.total else ""
        return f"{self.done}/{self.total} steps ({trial}), {elapsed:.0f} s{estimate}"

    def _show(self, trial: str, *, final: bool) -> None:
        now = time.perf_counter()
        if self.terminal and (final or now - self.shown >= 0.2):
            filled = self.WIDTH * self.done // max(1, self.total)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            print(f"\r\033[Kcomgra: [{bar}] {self.line(trial)}", end="", file=sys.stderr, flush=True)
            self.shown = now
        elif not self.terminal and (final or now - self.shown >= self.LINE_SECONDS):
            print(f"comgra: recorded {self.line(trial)}", file=sys.stderr, flush=True)
            self.shown = now

    def close(self) -> None:
        if self.terminal and self.done:
            print(file=sys.stderr, flush=True)
