"""The inputs of a torch.compile'd model on the steps comgra does not record (issue 32: inputs, labels or masks
zeroed on some steps). ``comgra.watch``'s every-step pre-hook runs inside what TorchDynamo traces there; it keeps the
call's arguments (a store Dynamo replays after the graph) and hands them to the sentinels at ``finish_batch``. The
sentinel rows must be the eager run's, step by step, the scan must name the zeroed mask with its steps, and the
compiled run must add no graph break and compile nothing after warm-up: for ``torch.compile(model)`` (the hook is a
frame of its own, outside the model's graph) and for a compiled function that calls the model (the hook is inlined
into the graph).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import comgra  # noqa: E402
from comgra.analysis import Scanner  # noqa: E402
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

from compiled_training import DynamoWatch  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")]
STEPS, BAD = 30, (13, 27)  # 1 step in 10 recorded: 13 and 27 are not
MASK = "model.input[attention_mask]"


class TokenClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 16), nn.Linear(16, 5)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        return nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), labels.flatten())


def _record(root: Path, trial: str, compiled: str) -> tuple[list[dict[str, int]], DynamoWatch]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    recorder = ComgraRecorder(root, "group", trial, DecisionMakerForRecordingsFrequencyPerType(
        min_training_steps_difference=10), flush_seconds=60.0, resource_seconds=None)
    model = TokenClassifier()
    watch = comgra.watch(model, recorder=recorder, name="model")
    call: Any = model
    if compiled == "model":
        call = torch.compile(model)
    elif compiled == "function":  # the model called inside a compiled function: its hooks are inlined there
        call = torch.compile(lambda ids, attention_mask, labels: model(ids, attention_mask=attention_mask,
                                                                       labels=labels) * 1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    dynamo, counts = DynamoWatch(), []
    with dynamo.watching():
        for step in range(STEPS):
            ids = torch.randint(1, 50, (8, 12), generator=generator)
            mask = torch.ones(8, 12, dtype=torch.long)
            if step % 3 == 0:
                mask[:, 9:] = 0  # padded batches on some steps
            if step in BAD:
                mask = torch.zeros_like(mask)  # the collate function's bug
            recorder.start_batch(step, 8)
            recorder.start_iteration()
            loss = call(ids, attention_mask=mask, labels=ids % 5)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            recorder.finish_iteration()
            recorder.finish_batch()
            counts.append(dynamo.counts())
    watch.remove()
    recorder.finalize()
    return counts, dynamo


def _sentinels(root: Path, trial: str) -> dict[tuple[str, int], tuple[float, float, int]]:
    rows = GroupReader(root / "group").trial(trial).evidence("sentinels").to_pylist()
    return {(r["name"], r["training_step"]): (r["value_min"], r["value_max"], r["numel"]) for r in rows
            if r["source"] == "input"}


@pytest.mark.parametrize("compiled", ["model", "function"])
def test_a_compiled_models_inputs_reach_the_sentinels_on_every_step(tmp_path: Path, compiled: str) -> None:
    _record(tmp_path, "eager", "no")
    counts, dynamo = _record(tmp_path, compiled, compiled)
    assert dynamo.graph_breaks.messages == [] and dynamo.recompiles.messages == []
    assert counts[-1]["graph_breaks"] == 0 and all(c == counts[1] for c in counts[2:]), counts  # no compile after step 1
    eager, seen = _sentinels(tmp_path, "eager"), _sentinels(tmp_path, compiled)
    assert seen == eager
    assert sorted(step for name, step in seen if name == MASK) == list(range(STEPS))
    assert [seen[MASK, step][:2] for step in BAD] == [(0.0, 0.0)] * len(BAD)
    findings = [f for f in Scanner().scan(tmp_path / "group", trials=[compiled]).findings
                if f.evidence.get("problem") == "input_collapsed"]
    assert [(f.node, f.steps, f.evidence["steps_unrecorded"]) for f in findings] == [(MASK, list(BAD), 2)]
