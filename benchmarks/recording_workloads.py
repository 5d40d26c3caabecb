"""Workloads for the recording benchmarks, written against the documented Comgra API only.

This file runs unchanged under our comgra and under the original comgra 0.11.5
(in its own virtual environment), so both are measured on the same code.
Run one measurement and print it as JSON:

    python benchmarks/recording_workloads.py --workload tutorial --mode schedule --steps 600 --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATION_CHOICES = list(range(1, 11))


class SubNet(nn.Module):
    def __init__(self, n_in: int, hidden: int, n_out: int):
        super().__init__()
        self.fnn1 = nn.Linear(n_in, hidden)
        self.fnn2 = nn.Linear(hidden, n_out)

    def forward(self, x):
        return F.leaky_relu(self.fnn2(F.leaky_relu(self.fnn1(x), 0.01)), 0.01)


class TutorialNet(nn.Module):
    """The tutorial's recurrent net: pre-processing, memory update, output, leaky ReLU everywhere."""

    def __init__(self, hidden: int = 200, memory: int = 50):
        super().__init__()
        self.memory_size = memory
        self.subnet_pre = SubNet(5 + memory, hidden, hidden)
        self.subnet_mem = SubNet(hidden + memory, hidden, memory)
        self.subnet_out = SubNet(memory, hidden, 5)


class TinyTransformer(nn.Module):
    def __init__(self, d_model: int = 64, layers: int = 2, vocab: int = 50):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=128, batch_first=True, dropout=0.0), layers)
        self.head = nn.Linear(d_model, vocab)


def make_recorder(comgra, objects, mode: str, out: Path, trial: str, schedule_gap: int):
    from comgra.recorder import ComgraRecorder
    if mode == "all":
        policy = objects.DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=1)
    else:
        policy = objects.DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=schedule_gap)
    out.mkdir(parents=True, exist_ok=True)  # the original needs the root to exist
    return ComgraRecorder(comgra_root_path=str(out), group="bench", trial_id=trial,
                          decision_maker_for_recordings=policy, max_num_batch_size_to_record=5,
                          comgra_is_active=(mode != "inactive"))


def tutorial_step(rec, model, optimizer, step: int, batch: int = 128):
    n = ITERATION_CHOICES[step % len(ITERATION_CHOICES)]
    x = torch.rand(batch, n, 5) * 2 - 1
    target = (x.sum(1) > 0).float()
    if rec:
        rec.start_batch(step, batch, type_of_execution=f"{n:02d}_iterations")
    memory = torch.zeros(batch, model.memory_size)
    if rec:
        rec.register_tensor("initial_memory", memory, is_initial_value=True)
    for i in range(n):
        x_i = x[:, i, :]
        if rec:
            rec.start_iteration()
            rec.register_tensor("input", x_i, is_input=True)
        hidden = model.subnet_pre(torch.cat([x_i, memory], dim=1))
        if rec:
            rec.register_tensor("subnet_pre__hidden_state", hidden)
        memory = model.subnet_mem(torch.cat([hidden, memory], dim=1))
        if rec:
            rec.register_tensor("subnet_mem__memory", memory)
        if i == n - 1:
            out = model.subnet_out(memory)
            output = torch.sigmoid(out)
            loss_per_sample = F.binary_cross_entropy(output, target, reduction="none").mean(1, keepdim=True)  # (B, 1): the original needs a value dim
            loss = loss_per_sample.mean()
            if rec:
                rec.register_tensor("subnet_out__out", out)
                rec.register_tensor("output", output)
                rec.register_tensor("target", target, is_target=True)
                rec.register_tensor("loss_per_sample", loss_per_sample)
                rec.add_tensor_connection("target", "loss_per_sample")  # BCE has no autograd edge to its target
                rec.register_tensor("loss", loss, is_loss=True)
                rec.record_kpi_in_graph("loss", "", loss)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rec:
                rec.record_current_gradients("gradients")
        if rec:
            rec.finish_iteration()
    if rec:
        rec.finish_batch()


def transformer_step(rec, model, optimizer, step: int, batch: int = 32, length: int = 24):
    tokens = torch.randint(0, 50, (batch, length))
    target = tokens.roll(1, dims=1)
    if rec:
        rec.start_batch(step, batch, type_of_execution="main")
        rec.start_iteration()
    emb = model.embed(tokens)
    if rec:
        rec.register_tensor("embedding", emb, is_input=True)
    hidden = emb
    for index, layer in enumerate(model.encoder.layers):
        hidden = layer(hidden)
        if rec:
            rec.register_tensor(f"layer{index}", hidden)
    logits = model.head(hidden)
    loss = F.cross_entropy(logits.reshape(-1, 50), target.reshape(-1))
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


WORKLOADS = {"tutorial": (TutorialNet, tutorial_step), "transformer": (TinyTransformer, transformer_step)}


def measure(workload: str, mode: str, steps: int, out: Path, schedule_gap: int, seed: int = 0) -> dict:
    """mode: none (no comgra), inactive (comgra_is_active=False), schedule (the tutorial's policy), all (every step)."""
    import comgra
    from comgra import objects
    torch.manual_seed(seed)
    random.seed(seed)
    torch.set_num_threads(1)
    model_class, step_function = WORKLOADS[workload]
    model = model_class()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trial = f"{workload}_{mode}_{os.getpid()}"
    rec = None
    if mode != "none":
        rec = make_recorder(comgra, objects, mode, out, trial, schedule_gap)
        comgra.my_recorder = rec
        rec.track_module("main_model", model)
    start = time.perf_counter()
    for step in range(steps):
        step_function(rec, model, optimizer, step)
    if rec:
        rec.finalize()
    seconds = time.perf_counter() - start
    trial_dir = out / "bench" / "trials" / trial
    files = [p for p in trial_dir.rglob("*") if p.is_file()] if trial_dir.exists() else []
    result = {"workload": workload, "mode": mode, "steps": steps, "seconds": seconds,
              "bytes": sum(p.stat().st_size for p in files), "files": len(files),
              "comgra_version": getattr(comgra, "__version__", "0.11.5 (original)"),
              "recorded_steps": _recorded_steps(trial_dir)}
    shutil.rmtree(trial_dir, ignore_errors=True)
    return result


def _recorded_steps(trial_dir: Path) -> int:
    configurations = trial_dir / "configurations"  # the original: one pickle per recorded step
    if configurations.is_dir():
        return len(list(configurations.glob("*")))
    steps = trial_dir / "steps"
    if steps.is_dir():
        import pyarrow.parquet as pq
        return len({s for p in steps.glob("*.parquet") for s in pq.read_table(p)["training_step"].to_pylist()})
    return 0


def main(argv: list[str] | None = None) -> None:
    import warnings
    warnings.simplefilter("ignore")  # the original prints deprecation noise; ours warns about the workload
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="tutorial")
    parser.add_argument("--mode", choices=["none", "inactive", "schedule", "all"], default="none")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--schedule-gap", type=int, default=1000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.workload, args.mode, args.steps, args.out, args.schedule_gap)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
