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
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

ITERATION_CHOICES = list(range(1, 11))
DEVICE = torch.device("cpu")  # resnet18 and gpt run on --device


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


class BasicBlock(nn.Module):
    """ResNet-18's block: conv-BN-ReLU(inplace)-conv-BN, ``out += identity``, ReLU(inplace)."""

    def __init__(self, n_in: int, n_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(n_in, n_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(n_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(n_out, n_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(n_out)
        self.downsample = None
        if stride != 1 or n_in != n_out:
            self.downsample = nn.Sequential(nn.Conv2d(n_in, n_out, 1, stride, bias=False), nn.BatchNorm2d(n_out))

    def forward(self, x, observe, name: str):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.bn1(self.conv1(x))
        observe(f"{name}_bn1", out)
        out = self.relu(out)  # overwrites the registered BN output
        out = self.bn2(self.conv2(out))
        observe(f"{name}_bn2", out)
        out += identity  # so does the residual sum
        out = self.relu(out)
        observe(f"{name}_out", out)
        return out


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 reduce, 3x3, 1x1 expand (x4), each followed by BN; ``out += identity``."""

    expansion = 4

    def __init__(self, n_in: int, width: int, stride: int = 1):
        super().__init__()
        n_out = width * self.expansion
        self.conv1 = nn.Conv2d(n_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, n_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(n_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or n_in != n_out:
            self.downsample = nn.Sequential(nn.Conv2d(n_in, n_out, 1, stride, bias=False), nn.BatchNorm2d(n_out))

    def forward(self, x, observe, name: str):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        observe(f"{name}_bn3", out)
        out += identity
        out = self.relu(out)
        observe(f"{name}_out", out)
        return out


class ResNet(nn.Module):
    """torchvision's ResNet layout, written here (torchvision is not a dependency).

    ResNet(BasicBlock, (2, 2, 2, 2), classes=10): ResNet-18, 11.2M parameters in 62 tensors.
    ResNet(Bottleneck, (3, 4, 6, 3), classes=1000): ResNet-50, 25.6M parameters in 161 tensors.
    ``observe(name, tensor)`` sees the stem's BN output, BN outputs inside the blocks and block outputs.
    """

    def __init__(self, block=BasicBlock, layers=(2, 2, 2, 2), classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        expansion = getattr(block, "expansion", 1)
        stages, n_in = [], 64
        for index, (width, count) in enumerate(zip((64, 128, 256, 512), layers)):
            blocks = []
            for position in range(count):
                stride = 2 if index > 0 and position == 0 else 1
                blocks.append(block(n_in, width, stride))
                n_in = width * expansion
            stages.append(nn.ModuleList(blocks))
        self.stages = nn.ModuleList(stages)
        self.fc = nn.Linear(512 * expansion, classes)

    def forward(self, images, observe=lambda name, tensor: None):
        out = self.bn1(self.conv1(images))
        observe("stem_bn", out)
        out = self.maxpool(self.relu(out))
        for s, stage in enumerate(self.stages):
            for b, block in enumerate(stage):
                out = block(out, observe, f"layer{s + 1}_{b}")
        return self.fc(out.mean((2, 3)))


class ResNet18(ResNet):
    def __init__(self):
        super().__init__(BasicBlock, (2, 2, 2, 2), classes=10)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class GptBlock(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    """nanoGPT's layout, small: token and position embeddings, pre-norm blocks, lm_head tied to wte."""

    def __init__(self, vocab: int = 4096, context: int = 64, width: int = 256, layers: int = 4, heads: int = 4):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList([GptBlock(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in nanoGPT


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


def resnet_step(rec, model, optimizer, step: int, batch: int = 8, size: int = 32):
    images = torch.randn(batch, 3, size, size, device=DEVICE)
    labels = torch.randint(0, 10, (batch,), device=DEVICE)
    if rec:
        rec.start_batch(step, batch, type_of_execution="main")
        rec.start_iteration()
        rec.register_tensor("images", images, is_input=True, recording_type="kpis")

    def observe(name, tensor):
        # 'kpis' for conv maps: the original crashes on tensors with >= 3 non-batch dims under 'neuron'
        if rec:
            rec.register_tensor(name, tensor, recording_type="kpis")

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


def gpt_step(rec, model, optimizer, step: int, batch: int = 4, length: int = 64):
    tokens = torch.randint(0, model.vocab, (batch, length + 1), device=DEVICE)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    if rec:
        rec.start_batch(step, batch, type_of_execution="main")
        rec.start_iteration()
    x = model.wte(inputs) + model.wpe(torch.arange(length, device=DEVICE))
    if rec:
        rec.register_tensor("embedding", x, is_input=True, recording_type="kpis")
    for index, block in enumerate(model.h):
        x = block(x)
        if rec:
            rec.register_tensor(f"block{index}", x, recording_type="kpis")  # see resnet_step
    logits = model.lm_head(model.ln_f(x))
    loss = F.cross_entropy(logits.reshape(-1, model.vocab), targets.reshape(-1))
    if rec:
        rec.register_tensor("logits", logits, recording_type="kpis")
        rec.register_tensor("loss", loss, is_loss=True)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rec:
        rec.record_current_gradients("gradients")
        rec.finish_iteration()
        rec.finish_batch()


WORKLOADS = {"tutorial": (TutorialNet, tutorial_step), "transformer": (TinyTransformer, transformer_step),
             "resnet18": (ResNet18, resnet_step), "gpt": (Gpt, gpt_step)}


def make_optimizer(workload: str, model: nn.Module) -> torch.optim.Optimizer:
    if workload.startswith("resnet"):  # how ResNets are trained: SGD with momentum
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def prepare(workload: str, seed: int = 0, device: str = "cpu") -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """A workload's model, optimizer and step function, seeded, on one thread, with our kernel built or loaded
    before any clock starts: how every benchmark of a recorded workload begins."""
    torch.manual_seed(seed)
    random.seed(seed)
    torch.set_num_threads(1)
    model_class, step_function = WORKLOADS[workload]
    global DEVICE
    DEVICE = torch.device(device)
    model = model_class().to(DEVICE)
    optimizer = make_optimizer(workload, model)
    _build_kernels()
    return model, optimizer, step_function


def measure(workload: str, mode: str, steps: int, out: Path, schedule_gap: int, seed: int = 0,
            device: str = "cpu", batch: int | None = None) -> dict:
    """mode: none (no comgra), inactive (comgra_is_active=False), schedule (the tutorial's policy), all (every step)."""
    import comgra
    from comgra import objects
    model, optimizer, step_function = prepare(workload, seed, device)
    trial = f"{workload}_{mode}_{os.getpid()}"
    rec = None
    if mode != "none":
        rec = make_recorder(comgra, objects, mode, out, trial, schedule_gap)
        comgra.my_recorder = rec
        rec.track_module("main_model", model)
    start, cpu_start, main_start = time.perf_counter(), time.process_time(), time.thread_time()
    sizes = {} if batch is None else {"batch": batch}
    for step in range(steps):
        step_function(rec, model, optimizer, step, **sizes)
    if rec:
        rec.finalize()
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    cpu_seconds, main_seconds = time.process_time() - cpu_start, time.thread_time() - main_start
    trial_dir = out / "bench" / "trials" / trial
    files = [p for p in trial_dir.rglob("*") if p.is_file()] if trial_dir.exists() else []
    # cpu_seconds: every thread of the process (robust to other processes on a shared machine);
    # main_seconds: the training thread only (the critical path when a core is free for helper threads).
    result = {"workload": workload, "mode": mode, "steps": steps, "seconds": seconds,
              "cpu_seconds": cpu_seconds, "main_seconds": main_seconds,
              "bytes": sum(p.stat().st_size for p in files), "files": len(files),
              "comgra_version": getattr(comgra, "__version__", "0.11.5 (original)"),
              "recorded_steps": _recorded_steps(trial_dir)}
    shutil.rmtree(trial_dir, ignore_errors=True)
    return result


def _build_kernels() -> None:
    """Ours: build (once per machine, cached) or load the one-pass statistics kernel before the clock
    starts, as a user's second run finds it; the original and earlier versions have none."""
    try:
        from comgra.capture import fused
    except ImportError:
        return
    fused.ensure_built()


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
    parser.add_argument("--device", default="cpu", help="cuda: run resnet18 and gpt on the GPU")
    parser.add_argument("--batch", type=int, help="batch size instead of the workload's default")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.workload, args.mode, args.steps, args.out, args.schedule_gap, device=args.device,
                                     batch=args.batch)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
