"""Inputs, labels and masks zeroed (or collapsed to one value) on some steps, mostly ones the policy does not record:
the every-step sentinels watch the tensors registered as inputs and targets, and comgra.watch's model inputs (token
ids, masks and labels too), so the scan names the input and the steps; inputs constant by design stay silent."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn

import comgra
from comgra.analysis import Scanner
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder

STEPS, BAD = 40, (13, 27)  # the policy records every 10th step: 13 and 27 are not recorded


class TokenClassifier(nn.Module):
    """Per-token classes from ids, an attention mask and labels, as a transformers model is called."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 16), nn.Linear(16, 5)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                timestep: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        if timestep is not None:
            hidden = hidden + timestep.view(-1, 1, 1) / 100
        return nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), labels.flatten())


def _record(root: Path, trial: str, plant: str) -> None:
    torch.manual_seed(0)
    recorder = ComgraRecorder(root, "group", trial, DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=10))
    model = TokenClassifier()
    recorder.track_module("model", model)
    watch = comgra.watch(model, recorder=recorder, name="model")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(STEPS):
        ids = torch.randint(1, 50, (8, 12))
        labels = ids % 5
        mask = torch.ones(8, 12, dtype=torch.long)  # as a tokenizer returns it
        if plant != "mask_always_ones" and step % 3 == 0:  # padded batches on some steps: zeros at the end
            mask[:, 9:] = 0
        features = torch.randn(8, 6)
        timestep = torch.full((8,), float(torch.randint(0, 5, ())))  # one timestep per batch: 0 on some steps
        if step in BAD:
            if plant == "zeroed_input":
                features = torch.zeros_like(features)
            elif plant == "mask_zeros":
                mask = torch.zeros_like(mask)
            elif plant == "labels_one_value":
                labels = torch.zeros_like(labels)
        recorder.start_batch(step, 8)
        recorder.start_iteration()
        recorder.register_tensor("features", features, is_input=True)
        loss = model(ids, attention_mask=mask, labels=labels, timestep=timestep if plant == "timestep" else None)
        loss = loss + 0.0 * features.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recorder.finish_iteration()
        recorder.finish_batch()
    watch.remove()
    recorder.finalize()


@pytest.mark.parametrize(("plant", "node"), [("zeroed_input", "features"), ("mask_zeros", "model.input[attention_mask]"),
                                             ("labels_one_value", "model.input[labels]")])
def test_an_input_collapsed_on_unrecorded_steps_is_named_with_its_steps(tmp_path: Path, plant: str, node: str) -> None:
    _record(tmp_path, "bug", plant)
    findings = [f for f in Scanner().scan(tmp_path / "group").findings if f.severity in ("error", "warning")]
    collapsed = [f for f in findings if f.evidence.get("problem") == "input_collapsed"]
    assert [(f.node, f.steps, f.evidence["steps_unrecorded"]) for f in collapsed] == [(node, list(BAD), 2)]
    assert collapsed[0] in findings[:3] and collapsed[0].detector == "sentinel_events"


@pytest.mark.parametrize("plant", ["healthy", "mask_always_ones", "timestep"])
def test_inputs_constant_by_design_stay_silent(tmp_path: Path, plant: str) -> None:
    """An all-ones mask of unpadded batches (some steps, or every step) and a timestep constant within each batch."""
    _record(tmp_path, "fixed", plant)
    findings = Scanner().scan(tmp_path / "group").findings
    assert [f.message for f in findings if f.detector == "sentinel_events"] == []
