"""comgra.watch on outputs and calls of the real world: dataclass outputs, outputs it cannot look into,
``model.generate()`` inside a recorded step, and compiled models (issue 31, items 2, 3 and 4)."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import comgra
from comgra.analysis import Scanner
from comgra.integrations.steps import IntegrationWarning
from comgra.service import RecordingService

GROUP, TRIAL = "group", "trial"  # make_recorder's (tests/conftest.py)
B, T = 3, 5


@dataclasses.dataclass
class Prediction:
    logits: torch.Tensor
    hidden: torch.Tensor
    note: str = "plain dataclass"


class DataclassModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Prediction:
        hidden = torch.tanh(self.layer(x))
        return Prediction(logits=hidden * 2, hidden=hidden)


class Opaque:
    """An output type comgra cannot look into (no container, no dataclass)."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class OpaqueModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Opaque:
        return Opaque(self.layer(x))


def _nodes(store_root: Any, step: int = 0, iteration: int = 0) -> set[str]:
    service = RecordingService(store_root / GROUP)
    try:
        return {n["id"] for n in service.graph_at(TRIAL, step, iteration)["nodes"]}
    finally:
        service.close()


def _one_step(recorder: Any, model: Any, x: torch.Tensor, loss_of: Any) -> None:
    recorder.start_batch(0, B)
    recorder.start_iteration()
    loss_of(model(x)).backward()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()


def test_a_dataclass_output_is_recorded_field_by_field(make_recorder, store_root, generator) -> None:
    model = DataclassModel()
    recorder = make_recorder({0})
    comgra.watch(model, recorder=recorder)
    x = torch.randn(B, 4, generator=generator)
    _one_step(recorder, model, x, lambda out: out.logits.sum())
    recorder.finalize()
    assert {"model[logits]", "model[hidden]", "model.layer"} <= _nodes(store_root)
    service = RecordingService(store_root / GROUP)
    try:
        (row,) = service.tensor_rows(TRIAL, 0, node="model[logits]", kind="forward", aggregation="sample",
                                     sample=1).to_pylist()
    finally:
        service.close()
    with torch.no_grad():
        expected = float((torch.tanh(model.layer(x)) * 2)[1].mean())
    assert row["mean"] == pytest.approx(expected, rel=1e-5)


def test_an_output_comgra_cannot_look_into_warns_once(make_recorder, store_root, generator) -> None:
    model = OpaqueModel()
    recorder = make_recorder({0, 1})
    comgra.watch(model, recorder=recorder)
    x = torch.randn(B, 4, generator=generator)
    with pytest.warns(IntegrationWarning, match=r"model returned a Opaque.*register_tensor") as caught:
        for step in range(2):
            recorder.start_batch(step, B)
            recorder.start_iteration()
            model(x).value.sum().backward()
            recorder.finish_iteration()
            recorder.finish_batch()
    assert len([w for w in caught if issubclass(w.category, IntegrationWarning)]) == 1
    recorder.finalize()
    assert "model.layer" in _nodes(store_root)


def _generate_in_step(recorder: Any, model: Any, generator: Any, step: int) -> None:
    ids = torch.randint(1, 32, (B, T), generator=generator)
    recorder.start_batch(step, B)
    recorder.start_iteration()
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    recorder.record_current_gradients("gradients")
    model.generate(ids[:, :2], max_new_tokens=6, do_sample=False, pad_token_id=0)  # a sample of text, as people do
    recorder.finish_iteration()
    recorder.finish_batch()


def test_generate_in_a_training_step_neither_floods_the_graph_nor_alarms(
        make_recorder, store_root, tiny_gpt2, generator) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0,
                                     eos_token_id=0)  # dropout on (0.1), as GPT-2's defaults
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    recorder = make_recorder({0, 2, 4})
    comgra.watch(model, recorder=recorder, name="gpt")
    for step in range(5):
        _generate_in_step(recorder, model, generator, step)
    recorder.finalize()
    nodes = _nodes(store_root)
    assert "gpt.transformer.h.1" in nodes
    assert not [n for n in nodes if "@" in n]  # before: every decoding call of every module, @2 ... @7
    found = Scanner().scan(store_root / GROUP).findings
    assert not [f for f in found if "evaluation" in f.message and f.severity == "error"], \
        [f.message for f in found if f.severity == "error"]


def test_generate_on_an_evaluation_step_records_its_first_call(make_recorder, store_root, tiny_gpt2, generator) -> None:
    model = tiny_gpt2(n_layer=2).eval()
    recorder = make_recorder({0})
    comgra.watch(model, recorder=recorder, name="gpt")
    ids = torch.randint(1, 32, (B, T), generator=generator)
    recorder.start_batch(0, B, type_of_execution="evaluation")
    recorder.start_iteration()
    model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    nodes = _nodes(store_root)
    assert {"gpt", "gpt.transformer.h.0"} <= {n.split("[")[0] for n in nodes}
    assert not [n for n in nodes if "@" in n]


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # inductor's own imports
def test_a_compiled_model_is_watched_under_its_own_names(make_recorder, store_root, generator) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    compiled = torch.compile(model)
    recorder = make_recorder({0})
    comgra.watch(compiled, recorder=recorder)
    x = torch.randn(B, 4, generator=generator)
    _one_step(recorder, compiled, x, lambda out: out.sum())
    recorder.finalize()
    nodes = _nodes(store_root)
    assert {"model.0", "model.2"} <= nodes  # the names its parameters have (model.0.weight), not model._orig_mod.0
    assert not [n for n in nodes if "_orig_mod" in n]


def test_torch_autograd_backward_is_torchs_own_once_no_watch_is_active(make_recorder) -> None:
    """comgra.watch sees the loss by wrapping torch.autograd.backward while a watch is active; removing the last
    watch (or finalize) gives torch its own function back (house style: hooks exist while a recorder is active)."""
    original = torch.autograd.backward
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    recorder = make_recorder({0})
    first = comgra.watch(model, recorder=recorder)
    assert torch.autograd.backward is not original
    second = comgra.watch(torch.nn.Linear(2, 2), recorder=recorder, name="other")
    first.remove()
    assert torch.autograd.backward is not original  # one watch still active
    second.remove()
    assert torch.autograd.backward is original
