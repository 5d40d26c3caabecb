"""Tiny ``transformers`` models built from configs, with random weights (nothing is downloaded)."""
from __future__ import annotations

from typing import Any

import pytest

N_LAYERS = 12
VOCAB = 32


def tiny_gpt2(seed: int = 0, n_layer: int = N_LAYERS) -> Any:
    """A GPT-2 with GPT-2's 12 blocks and a width of 8."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=n_layer, n_embd=8, n_head=2, vocab_size=VOCAB, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transformers.GPT2LMHeadModel(config)


def tiny_bert(seed: int = 0, n_layer: int = 2) -> Any:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    config = transformers.BertConfig(num_hidden_layers=n_layer, hidden_size=8, num_attention_heads=2,
                                     intermediate_size=16, vocab_size=VOCAB, max_position_embeddings=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transformers.BertForMaskedLM(config)


@pytest.fixture(name="tiny_gpt2")
def _tiny_gpt2() -> Any:
    """``tiny_gpt2(seed=0, n_layer=12)``: a GPT2LMHeadModel of width 8."""
    return tiny_gpt2


@pytest.fixture(name="tiny_bert")
def _tiny_bert() -> Any:
    """``tiny_bert(seed=0, n_layer=2)``: a BertForMaskedLM of width 8."""
    return tiny_bert
