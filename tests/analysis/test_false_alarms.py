"""The false alarms of issue 32, each removed by its cause and each checked on a recording shaped like the real
case, beside the same recording with the real bug, which must still be found.

Every test records a small run through ``comgra.watch`` (as a user does) and scans it.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import comgra
from comgra.analysis import Finding, Scanner

GROUP = "g"
pytestmark = pytest.mark.filterwarnings("ignore::comgra.capture.session.ComgraWarning")  # integer labels, as users do


def record(root: Path, trial: str, model: nn.Module, batch: Callable[[int], dict[str, torch.Tensor]],
           loss_of: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor], *, steps: int = 30,
           optimizer: torch.optim.Optimizer | None = None, targets: tuple[str, ...] = ("labels",)) -> list[Finding]:
    """Train ``model`` for ``steps`` steps, every step recorded: the batch's tensors registered as inputs (those
    named in ``targets`` as targets), every module's output by ``comgra.watch``, the loss, the gradients."""
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    recorder = ComgraRecorder(root, GROUP, trial, DecisionMakerForRecordingsHardcoded(set(range(steps))),
                              max_num_batch_size_to_record=8, resource_seconds=None)
    watch = comgra.watch(model, recorder=recorder)
    optimizer = optimizer or torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    try:
        for step in range(steps):
            data = batch(step)
            recorder.start_batch(step, len(next(iter(data.values()))))
            recorder.start_iteration()
            for name, tensor in data.items():
                recorder.register_tensor(name, tensor, is_input=name not in targets, is_target=name in targets)
            loss = loss_of(model, data)
            recorder.register_tensor("loss", loss, is_loss=True)
            optimizer.zero_grad()
            loss.backward()
            recorder.record_current_gradients("gradients")
            recorder.finish_iteration()
            optimizer.step()
            recorder.finish_batch()
    finally:
        watch.remove()
        recorder.finalize()
    return Scanner().scan(root / GROUP, trials=[trial]).findings


def loud(findings: list[Finding], detector: str | None = None) -> list[Finding]:
    return [f for f in findings if f.severity in ("error", "warning") and detector in (None, f.detector)]


# -- constant_input ----------------------------------------------------------------------------------------------

def _images(generator: torch.Generator, zeroed: bool = False) -> Callable[[int], dict[str, torch.Tensor]]:
    """Photos as uint8 (saturating at 0 and 255), ToTensor, Normalize per channel, clamped: every image reaches
    the same maximum, the images differ."""
    templates = torch.rand(4, 3, 8, 8, generator=generator) * 255
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)

    def batch(step: int) -> dict[str, torch.Tensor]:
        labels = torch.randint(0, 4, (16,), generator=generator)
        pixels = (templates[labels] + 80 * torch.randn(16, 3, 8, 8, generator=generator)).clamp(0, 255).round()
        x = ((pixels / 255 - mean) / std).clamp(-2.5, 2.5)
        return {"image": torch.zeros_like(x) if zeroed else x, "labels": labels}
    return batch


def _convnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def test_clamped_normalised_images_are_not_constant(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    batch = _images(generator)
    assert (batch(0)["image"].amax(dim=(1, 2, 3)) == batch(0)["image"].max()).all()  # the case: every maximum alike
    findings = record(tmp_path, "clamped", _convnet(), batch, lambda m, b: nn.functional.cross_entropy(m(b["image"]), b["labels"]))
    assert not [f for f in findings if f.detector == "constant_input"]
    zeroed = record(tmp_path, "zeroed", _convnet(), _images(generator, zeroed=True),
                    lambda m, b: nn.functional.cross_entropy(m(b["image"]), b["labels"]))
    assert [f.node for f in loud(zeroed, "constant_input")] == ["image"]


class _Tagger(nn.Module):
    """Token ids and an attention mask in, a class per token out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(32, 16)
        self.head = nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids) * mask[..., None])


def _tokens(generator: torch.Generator, mask: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[int], dict]:
    def batch(step: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 32, (8, 12), generator=generator)
        return {"input_ids": ids, "attention_mask": mask(ids), "labels": (ids + 1) % 32}
    return batch


def _tagging_loss(model: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(b["input_ids"], b["attention_mask"]).flatten(0, 1), b["labels"].flatten())


def test_an_all_ones_attention_mask_beside_varying_tokens_is_information_not_a_warning(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    findings = record(tmp_path, "unpadded", _Tagger(), _tokens(generator, torch.ones_like), _tagging_loss)
    constant = [f for f in findings if f.detector == "constant_input"]
    assert [(f.node, f.severity) for f in constant] == [("attention_mask", "info")]
    assert "input_ids" in constant[0].message
    zeroed = record(tmp_path, "zeroed_mask", _Tagger(), _tokens(generator, torch.zeros_like), _tagging_loss)
    assert [f.node for f in loud(zeroed, "constant_input")] == ["attention_mask"]  # a mask zeroed in transit


# -- growth_along_edge at a normalisation -----------------------------------------------------------------------

class _Residual(nn.Module):
    """GPT-2 at initialisation: every weight normal(0, 0.02), so the attention's projection out of 0.02-scale
    embeddings is about 1e-3; the LayerNorm after it brings it to unit scale (2.5 orders of magnitude up)."""

    def __init__(self, amplify: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(32, 32)
        self.proj = nn.Linear(32, 32)
        for weight in (self.embed.weight, self.proj.weight):
            nn.init.normal_(weight, std=0.02)
        nn.init.zeros_(self.proj.bias)
        self.ln = nn.LayerNorm(32)
        self.mlp = nn.Linear(32, 32)
        with torch.no_grad():
            self.mlp.weight.mul_(amplify)
        self.head = nn.Linear(32, 32)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.ln(self.proj(self.embed(ids)))))


def test_a_layernorm_output_larger_than_its_input_is_by_construction(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    findings = record(tmp_path, "gpt2_like", _Residual(), _tokens(generator, torch.ones_like), _tagging_loss, steps=12)
    assert not [f for f in findings if f.detector == "growth_along_edge"]
    amplified = record(tmp_path, "amplified", _Residual(amplify=1e4), _tokens(generator, torch.ones_like),
                       _tagging_loss, steps=12)
    assert "mlp" in [f.node.split(".")[-1] for f in loud(amplified, "growth_along_edge")]


# -- one finding per cause: a LoRA run's frozen base -------------------------------------------------------------

class _LoRA(nn.Module):
    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.a.t() @ self.b.t()


def test_a_frozen_base_is_one_finding_that_lists_its_tensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    model.requires_grad_(False)
    model[2] = _LoRA(model[2])
    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 16, generator=generator)

    def batch(step: int) -> dict[str, torch.Tensor]:
        labels = torch.randint(0, 4, (16,), generator=generator)
        return {"x": centres[labels] + 0.3 * torch.randn(16, 16, generator=generator), "labels": labels}
    findings = record(tmp_path, "lora", model, batch, lambda m, b: nn.functional.cross_entropy(m(b["x"]), b["labels"]))
    frozen = [f for f in findings if f.detector == "parameter_frozen"]
    assert len(frozen) == 1
    listed = {m["node"] for m in frozen[0].evidence["members"]}
    assert frozen[0].evidence["count"] == len(listed) == 6  # 3 linear layers' weights and biases, the base's among them
    assert {"model.0.weight", "model.2.base.weight", "model.4.bias"} <= listed
    assert frozen[0].to_json()["evidence"]["members"][0]["node"] in listed  # in the JSON the app shows


# -- bf16 rounding, not "left out of the optimizer" --------------------------------------------------------------

def test_layernorm_weights_of_full_bf16_training_are_rounded_not_left_out(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    model = _Residual().to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    findings = record(tmp_path, "bf16", model, _tokens(generator, torch.ones_like),
                      lambda m, b: _tagging_loss(m, b).float(), optimizer=optimizer, steps=12)
    stuck = [f for f in findings if f.detector == "parameter_not_updated"]
    assert stuck, "the LayerNorm weight (1.0) does not move by a 1e-3 Adam step in bfloat16"
    nodes = {stuck[0].node} | {m["node"] for m in stuck[0].evidence.get("members", [])}
    assert "model.ln.weight" in nodes
    assert all(f.evidence["cause"] == "rounding" and "bfloat16" in f.message and f.severity == "info" for f in stuck)
    assert "left out of the optimizer?" not in stuck[0].message
