"""A small nanoGPT-style GPT with ``register_tensor`` calls in its blocks, as a user of comgra writes them.

Shared by ``benchmarks/compiled_overhead.py`` and the torch.compile tests (tests/compile/). Causal
self-attention (``scaled_dot_product_attention``), a GELU MLP, pre-LayerNorm residual blocks, tied
token embedding and head. Each block registers its attention and MLP outputs and its own output under
names built at run time (``f"block{i}_out"``); the model registers its logits. The recorder is
``comgra.my_recorder`` when the model runs, as the README's examples do; None: no comgra at all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import comgra


@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    # Blocks build their tensor names only on recorded steps (``if recorder.recording_is_active()``): for a block
    # whose forward TorchDynamo compiles as a frame of its own (FSDP2's fully_shard per block), where reading
    # ``self.index`` for a name would specialise that frame on each block's index (one compile per block).
    names_on_recorded_steps_only: bool = False
    # The user's own graph break: a ``.item()`` after the first block (a check on the activations' size).
    item_after_first_block: bool = False


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = torch.nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = torch.nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, length, width))


class Block(torch.nn.Module):
    def __init__(self, config: GPTConfig, index: int):
        super().__init__()
        self.index = index
        self.names_on_recorded_steps_only = config.names_on_recorded_steps_only
        self.ln_1 = torch.nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = torch.nn.LayerNorm(config.n_embd)
        self.fc = torch.nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = torch.nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        recorder = comgra.my_recorder
        if recorder is not None and self.names_on_recorded_steps_only and not recorder.recording_is_active():
            recorder = None
        attended = self.attn(self.ln_1(x))
        if recorder is not None:
            recorder.register_tensor(f"block{self.index}_attn", attended)
        x = x + attended
        mlp = self.proj(F.gelu(self.fc(self.ln_2(x))))
        if recorder is not None:
            recorder.register_tensor(f"block{self.index}_mlp", mlp)
        x = x + mlp
        if recorder is not None:
            recorder.register_tensor(f"block{self.index}_out", x)
        return x


class GPT(torch.nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = torch.nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = torch.nn.Embedding(config.block_size, config.n_embd)
        self.blocks = torch.nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.ln_f = torch.nn.LayerNorm(config.n_embd)
        self.lm_head = torch.nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, parameter in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2's scaled initialisation of the residual projections
                torch.nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        recorder = comgra.my_recorder
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(positions)
        if recorder is not None:
            recorder.register_tensor("embedded", x)
        for block in self.blocks:
            x = block(x)
            if self.config.item_after_first_block and block.index == 0 and x.abs().max().item() > 1e6:
                x = x / 2
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        if recorder is not None:
            recorder.register_tensor("logits", logits)
            recorder.register_tensor("loss", loss, index_of_batch_dimension=None, is_loss=True)
        return loss


def make_gpt(config: GPTConfig, seed: int = 0) -> GPT:
    """The model with weights that depend on ``seed`` only."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(config)


def batches(config: GPTConfig, batch: int, count: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` (ids, targets) pairs of shape (batch, block_size), from their own generator."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(config.vocab_size, (count, batch, config.block_size + 1), generator=generator)
    return [(row[:, :-1].contiguous(), row[:, 1:].contiguous()) for row in data]
