"""The workloads of issue 34's cost breakdown and regression table (benchmarks/cost_breakdown.py,
benchmarks/regression.py), written against the documented API only, so that an older commit runs them too.

Each workload is a ``Workload``: a model built from a seed, a batch, and ``step(recorder, step_number)``
(recorder None: plain training, no comgra call at all). The recorder is made by ``make_recorder`` with the
workload's policy (``every``: 1 step in N recorded; 0: none; "inactive": ``comgra_is_active=False``).

  * conv:      a residual conv net (ResNet layout, one BasicBlock per stage: 4.9M parameters), batch 8 of
               32x32, every block's output registered; 1 step in 10 recorded.
  * attention: a small attention model (2-layer TransformerEncoder, d_model 64), batch 32 of 24 tokens;
               1 in 50 (and comgra inactive).
  * mlp:       the MLP 64-4x256-10, batch 64 (a 2-3 ms step), every Linear's output registered.
  * gpt_compiled: nanoGPT (benchmarks/nano_gpt.py, register_tensor inside its blocks), 4 layers, n_embd 128,
               torch.compile'd; 1 in 10.
  * gpt2:      transformers' GPT2LMHeadModel from a GPT2Config (4 layers, n_embd 256, 4 heads, vocab 8192,
               64 positions), its hidden states registered; 1 in 10.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass
class Workload:
    name: str
    every: int  # the policy's gap of the main measurement (1 in N recorded)
    build: Callable[[], tuple[nn.Module, Callable[..., Any]]]  # -> (model, forward(model, rec, batch) -> loss)
    batch: Callable[[int], Any]  # step number -> the step's inputs
    batch_size: int
    lr: float = 1e-3
    note: str = ""
    extra_modes: tuple[str, ...] = field(default=())


def _mlp() -> tuple[nn.Module, Callable[..., Any]]:
    layers: list[nn.Module] = [nn.Linear(64, 256), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    layers.append(nn.Linear(256, 10))
    model = nn.Sequential(*layers)

    def forward(model: nn.Module, rec: Any, batch: Any) -> torch.Tensor:
        x, y = batch
        if rec:
            rec.register_tensor("input", x, is_input=True)
        h = x
        for index, layer in enumerate(model):
            h = layer(h)
            if rec and isinstance(layer, nn.Linear):
                rec.register_tensor(f"linear{index}", h)
        loss = F.cross_entropy(h, y)
        if rec:
            rec.register_tensor("target", y, is_target=True)
            rec.register_tensor("loss", loss, is_loss=True)
        return loss
    return model, forward


def _mlp_batch(step: int) -> Any:
    generator = torch.Generator().manual_seed(step)
    return torch.randn(64, 64, generator=generator), torch.randint(0, 10, (64,), generator=generator)


def _conv() -> tuple[nn.Module, Callable[..., Any]]:
    import recording_workloads as shared
    model = shared.ResNet(shared.BasicBlock, (1, 1, 1, 1), classes=10)

    def forward(model: nn.Module, rec: Any, batch: Any) -> torch.Tensor:
        images, labels = batch
        if rec:
            rec.register_tensor("images", images, is_input=True)

        def observe(name: str, tensor: torch.Tensor) -> None:
            if rec:
                rec.register_tensor(name, tensor)
        logits = model(images, observe)
        loss = F.cross_entropy(logits, labels)
        if rec:
            rec.register_tensor("logits", logits)
            rec.register_tensor("loss", loss, is_loss=True)
        return loss
    return model, forward


def _conv_batch(step: int) -> Any:
    generator = torch.Generator().manual_seed(step)
    return torch.randn(8, 3, 32, 32, generator=generator), torch.randint(0, 10, (8,), generator=generator)


def _attention() -> tuple[nn.Module, Callable[..., Any]]:
    import recording_workloads as shared
    model = shared.TinyTransformer()

    def forward(model: nn.Module, rec: Any, batch: Any) -> torch.Tensor:
        tokens, target = batch
        if rec:
            rec.register_tensor("tokens", tokens, is_input=True)
        hidden = model.embed(tokens)
        if rec:
            rec.register_tensor("embedded", hidden)
        for index, layer in enumerate(model.encoder.layers):
            hidden = layer(hidden)
            if rec:
                rec.register_tensor(f"layer{index}", hidden)
        logits = model.head(hidden)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        if rec:
            rec.register_tensor("logits", logits)
            rec.register_tensor("loss", loss, is_loss=True)
        return loss
    return model, forward


def _attention_batch(step: int) -> Any:
    generator = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, 50, (32, 24), generator=generator)
    return tokens, tokens.roll(1, dims=1)


def _gpt_compiled() -> tuple[nn.Module, Callable[..., Any]]:
    import comgra
    import nano_gpt
    model = nano_gpt.make_gpt(nano_gpt.GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128))
    compiled = torch.compile(model)

    def forward(model: nn.Module, rec: Any, batch: Any) -> torch.Tensor:
        comgra.my_recorder = rec  # nano_gpt registers through comgra.my_recorder, inside the compiled blocks
        return compiled(*batch)
    return model, forward


def _gpt_batch(step: int) -> Any:
    generator = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 256, (8, 64), generator=generator)
    return ids, ids.roll(-1, dims=1)


def _gpt2() -> tuple[nn.Module, Callable[..., Any]]:
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)

    def forward(model: nn.Module, rec: Any, batch: Any) -> torch.Tensor:
        ids, = batch
        out = model(input_ids=ids, labels=ids, output_hidden_states=rec is not None)
        if rec:
            rec.register_tensor("input_ids", ids, is_input=True)
            for index, hidden in enumerate(out.hidden_states):
                rec.register_tensor(f"hidden{index}", hidden)
            rec.register_tensor("logits", out.logits)
            rec.register_tensor("loss", out.loss, is_loss=True)
        return out.loss
    return model, forward


def _gpt2_batch(step: int) -> Any:
    generator = torch.Generator().manual_seed(step)
    return (torch.randint(0, 8192, (4, 64), generator=generator),)


WORKLOADS = {
    "conv": Workload("conv", 10, _conv, _conv_batch, 8, lr=0.01, note="residual conv net, 4.9M parameters"),
    "attention": Workload("attention", 50, _attention, _attention_batch, 32, note="2-layer attention, d 64",
                          extra_modes=("inactive",)),
    "mlp": Workload("mlp", 10, _mlp, _mlp_batch, 64, note="MLP 64-4x256-10, batch 64",
                    extra_modes=("every1", "never")),
    "gpt_compiled": Workload("gpt_compiled", 10, _gpt_compiled, _gpt_batch, 8, note="compiled 4-layer GPT"),
    "gpt2": Workload("gpt2", 10, _gpt2, _gpt2_batch, 4, note="transformers GPT2 (4 layers, 256)"),
}


class Trainer:
    """One copy of a workload's model, its optimizer, and (None for plain training) its recorder."""

    def __init__(self, workload: Workload, recorder: Any, seed: int = 0):
        torch.manual_seed(seed)
        self.workload, self.recorder = workload, recorder
        self.model, self.forward = workload.build()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=workload.lr, momentum=0.9) \
            if workload.name == "conv" else torch.optim.Adam(self.model.parameters(), lr=workload.lr)
        if recorder is not None:
            recorder.track_module("model", self.model)
            if hasattr(recorder, "track_optimizer"):
                recorder.track_optimizer(self.optimizer)
        self.step_number = 0

    def step(self, batch: Any) -> None:
        rec = self.recorder
        if rec is not None:
            rec.start_batch(self.step_number, self.workload.batch_size)
            rec.start_iteration()
        loss = self.forward(self.model, rec, batch)
        self.optimizer.zero_grad()
        loss.backward()
        if rec is not None:
            rec.record_current_gradients("gradients")
        self.optimizer.step()
        if rec is not None:
            rec.finish_iteration()
            rec.finish_batch()
        self.step_number += 1


def setup_process() -> None:
    """A measuring child's setup: warnings quiet, one torch thread, comgra's C kernel built (where the side has it)."""
    import warnings
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    try:
        from comgra.capture import fused
        fused.ensure_built()
    except ImportError:
        pass


def make_recorder(root: Path, trial: str, mode: str) -> Any:
    """mode: "everyN" (1 step in N recorded), "never" (active, no step recorded), "inactive"."""
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType, DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder
    if mode == "never" or mode == "inactive":
        policy = DecisionMakerForRecordingsHardcoded(set())
    else:
        policy = DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=int(mode[len("every"):]))
    return ComgraRecorder(str(root), "bench", trial, policy, max_num_batch_size_to_record=5,
                          comgra_is_active=mode != "inactive")
