"""Tied weights (a GPT's ``lm_head.weight`` is ``wte.weight``): one parameter, shown once with both names."""
from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

VOCABULARY, WIDTH, BATCH, LENGTH = 64, 32, 2, 16


class TinyGPT(nn.Module):
    """Embedding, one MLP block, a head that shares the embedding's weight (nanoGPT's tying)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCABULARY, WIDTH)
        self.mlp = nn.Linear(WIDTH, WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCABULARY, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor, recorder: Any) -> torch.Tensor:
        x = self.wte(tokens)
        recorder.register_tensor("embeddings", x)
        logits = self.lm_head(torch.tanh(self.mlp(x)))
        recorder.register_tensor("logits", logits)
        return logits


def tiny_gpt2() -> tuple[nn.Module, Any]:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=WIDTH, n_head=2, vocab_size=VOCABULARY, n_positions=LENGTH)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight  # transformers ties them

    def forward(tokens: torch.Tensor, recorder: Any) -> torch.Tensor:
        logits = model(input_ids=tokens).logits
        recorder.register_tensor("logits", logits)
        return logits

    return model, forward


def tiny_gpt() -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = TinyGPT()
    return model, model


@pytest.mark.parametrize("build,first,second", [
    (tiny_gpt, "gpt.wte.weight", "gpt.lm_head.weight"),
    (tiny_gpt2, "gpt.transformer.wte.weight", "gpt.lm_head.weight"),
], ids=["nanogpt_style", "transformers_gpt2"])
def test_tied_parameter_is_one_node_with_both_names(make_recorder, record_step, open_trial, graph, generator,
                                                    store_root, build, first, second) -> None:
    model, forward = build()
    recorder = make_recorder({0})
    recorder.track_module("gpt", model)
    tokens = torch.randint(0, VOCABULARY, (BATCH, LENGTH), generator=generator)

    def forward_and_loss(recorder) -> torch.Tensor:
        logits = forward(tokens, recorder)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY), tokens.reshape(-1))
        recorder.register_tensor("loss", loss, is_loss=True)
        return loss

    record_step(recorder, 0, BATCH, forward_and_loss)
    recorder.finalize()
    trial = open_trial()

    document = graph(trial, 0, 0)
    nodes = {n["id"]: n for n in document["nodes"]}
    assert second not in nodes
    assert nodes[first]["aliases"] == [second]
    assert (first, "logits") in {(e["source"], e["target"]) for e in document["edges"]}

    names = trial.selection(training_step=0).column("tensor_name").to_pylist()
    assert second not in names
    assert names.count(first) == 2  # its value and its gradient, once each
    (gradient,) = [r for r in trial.selection(training_step=0, kind="gradients").to_pylist()
                   if r["tensor_name"] == first]
    weight_grad = model.lm_head.weight.grad
    assert gradient["abs_max"] == pytest.approx(weight_grad.abs().max().item(), rel=1e-5)

    entries = {p["full_name"]: p for p in _parameters(trial.metadata["modules"])}
    assert entries[second]["tied_to"] == first and "tied_to" not in entries[first]
    (tree,) = trial.metadata["modules"]
    assert tree["num_parameters"] == sum(p.numel() for p in model.parameters())  # counted once
    _assert_the_app_shows_both_names(store_root, nodes[first], first, second, tree["num_parameters"])


def _assert_the_app_shows_both_names(store_root, node, first: str, second: str, total: int) -> None:
    from comgra.server.graph_view import client_graph
    from comgra.server.panels import network_tree
    from comgra.service import RecordingService

    (shown,) = client_graph({"nodes": [node], "edges": []})["nodes"]  # what the page draws and hovers
    assert shown["aliases"] == [second] and "tied" in shown["detail"]
    modules = RecordingService(store_root / "group").modules("trial")
    assert modules[0]["total"] == total
    assert f"tied to {first}" in str(network_tree(modules))


def _parameters(trees: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for tree in trees:
        found += tree["parameters"] + _parameters(tree["submodules"])
    return found
