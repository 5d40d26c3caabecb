"""comgra.watch: every module's output in the graph, with one line, on 12-layer GPT-2 and BERT built from configs."""
from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import comgra
from comgra.errors import ConfigError, RecordingError
from comgra.service import RecordingService

GROUP, TRIAL = "group", "trial"  # make_recorder's (tests/conftest.py)
B, T = 3, 5


def _train(recorder: Any, model: Any, steps: range, generator: Any, *, own_tensors: bool = False) -> None:
    """The user's loop: the documented calls, no register_tensor for the model's insides."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in steps:
        ids = torch.randint(0, 32, (B, T), generator=generator)
        recorder.start_batch(step, B)
        recorder.start_iteration()
        output = model(input_ids=ids, labels=ids)
        if own_tensors:
            recorder.register_tensor("loss", output.loss, is_loss=True)
        output.loss.backward()
        recorder.record_current_gradients("gradients")
        optimizer.step()
        optimizer.zero_grad()
        recorder.finish_iteration()
        recorder.finish_batch()


def _graph(store_root: Any, step: int = 0, iteration: int = 0) -> tuple[set[str], set[tuple[str, str]], dict]:
    service = RecordingService(store_root / GROUP)
    try:
        document = service.graph_at(TRIAL, step, iteration)
    finally:
        service.close()
    nodes = {n["id"]: n for n in document["nodes"]}
    return set(nodes), {(e["source"], e["target"]) for e in document["edges"]}, nodes


def test_gpt2_every_block_in_the_graph_with_its_edges(make_recorder, store_root, tiny_gpt2, generator) -> None:
    model = tiny_gpt2()
    recorder = make_recorder({0})
    comgra.watch(model, recorder=recorder, name="gpt")  # the one line
    _train(recorder, model, range(2), generator)
    recorder.finalize()
    nodes, edges, entries = _graph(store_root)
    h = "gpt.transformer.h"
    for i in range(12):
        previous = f"{h}.{i - 1}" if i else "gpt.transformer.drop"
        assert {f"{h}.{i}", f"{h}.{i}.attn[0]", f"{h}.{i}.mlp"} <= nodes
        # the block: the residual stream in, attention and MLP added to it
        assert {(previous, f"{h}.{i}"), (f"{h}.{i}.attn[0]", f"{h}.{i}"), (f"{h}.{i}.mlp", f"{h}.{i}")} <= edges
        assert (previous, f"{h}.{i}.ln_1") in edges
        assert {(f"{h}.{i}.ln_1", f"{h}.{i}.attn.c_attn"), (f"{h}.{i}.attn.c_attn", f"{h}.{i}.attn.c_proj"),
                (f"{h}.{i}.mlp.c_fc", f"{h}.{i}.mlp.act"), (f"{h}.{i}.mlp.dropout", f"{h}.{i}.mlp")} <= edges
        assert (f"gpt.transformer.h.{i}.attn.c_attn.weight", f"{h}.{i}.attn.c_attn") in edges  # tracked parameters
        assert {s for s, t in edges if t == f"{h}.{i}"} == {previous, f"{h}.{i}.attn[0]", f"{h}.{i}.mlp"}
    assert {("gpt.transformer.wte", "gpt.transformer.drop"), ("gpt.transformer.wpe", "gpt.transformer.drop"),
            (f"{h}.11", "gpt.transformer.ln_f"), ("gpt.transformer[last_hidden_state]", "gpt.lm_head"),
            ("gpt.lm_head", "gpt[logits]"), ("gpt[logits]", "gpt[loss]")} <= edges
    assert entries[f"{h}.0"]["has_batch"] and not entries["gpt.transformer.wpe"]["has_batch"]  # (1, T, C)


def test_recorded_values_and_gradients_are_the_block_outputs(make_recorder, store_root, tiny_gpt2, generator) -> None:
    """The recorded value and gradient of a block's output against the test's own hooks."""
    model = tiny_gpt2(n_layer=2)
    mine: dict[str, torch.Tensor] = {}

    def keep(module: Any, args: Any, output: torch.Tensor) -> None:
        mine["value"] = output.detach().clone()
        output.register_hook(lambda grad: mine.__setitem__("grad", grad.detach().clone()))

    model.transformer.h[1].register_forward_hook(keep)
    recorder = make_recorder({0})
    comgra.watch(model, recorder=recorder, name="gpt")
    _train(recorder, model, range(1), generator)
    recorder.finalize()
    service = RecordingService(store_root / GROUP)
    try:
        rows = service.tensor_rows(TRIAL, 0, node="gpt.transformer.h.1", aggregation="sample", sample=1).to_pylist()
    finally:
        service.close()
    by_kind = {r["kind"]: r for r in rows}
    assert set(by_kind) == {"forward", "gradients"}
    for kind, tensor in (("forward", mine["value"][1]), ("gradients", mine["grad"][1])):
        assert by_kind[kind]["shape"] == [B, T, 8]
        assert by_kind[kind]["mean"] == pytest.approx(float(tensor.mean()), rel=1e-4, abs=1e-7)
        assert by_kind[kind]["abs_max"] == pytest.approx(float(tensor.abs().max()), rel=1e-5)


def test_bert_block_output_takes_over_from_its_last_layer(make_recorder, store_root, tiny_bert, generator) -> None:
    """BERT's layer returns its LayerNorm's tensor: LayerNorm -> output -> layer -> the next layer."""
    model = tiny_bert(n_layer=3)
    recorder = make_recorder({0})
    comgra.watch(model, recorder=recorder, name="bert")
    _train(recorder, model, range(1), generator)
    recorder.finalize()
    nodes, edges, _ = _graph(store_root)
    layer = "bert.bert.encoder.layer"
    for i in range(3):
        previous = f"{layer}.{i - 1}" if i else "bert.bert.embeddings"
        assert {(f"{layer}.{i}.output.LayerNorm", f"{layer}.{i}.output"), (f"{layer}.{i}.output", f"{layer}.{i}")} <= edges
        assert {(previous, f"{layer}.{i}.attention.self.{p}") for p in ("query", "key", "value")} <= edges
        assert (previous, f"{layer}.{i}.attention.output.LayerNorm") in edges  # the residual
    assert {("bert.bert.embeddings.LayerNorm", "bert.bert.embeddings.dropout"), (f"{layer}.2", "bert.bert.encoder[last_hidden_state]"),
            ("bert.cls", "bert[logits]"), ("bert[logits]", "bert[loss]")} <= edges
    assert not any(s == f"{layer}.{i}.output.LayerNorm" and t.startswith(f"{layer}.{i + 1}") for s, t in edges for i in range(3))


def test_own_register_tensor_calls_compose(make_recorder, store_root, tiny_gpt2, generator) -> None:
    model = tiny_gpt2(n_layer=2)
    recorder = make_recorder({0})
    comgra.watch(model, recorder=recorder, name="gpt")
    _train(recorder, model, range(1), generator, own_tensors=True)
    recorder.finalize()
    nodes, edges, entries = _graph(store_root)
    assert ("gpt[loss]", "loss") in edges and entries["loss"]["role"] == "loss"


def test_unrecorded_steps_touch_nothing(make_recorder, store_root, tiny_gpt2, generator, monkeypatch) -> None:
    model = tiny_gpt2(n_layer=2)
    recorder = make_recorder({0})
    comgra.watch(model, recorder=recorder, name="gpt")
    _train(recorder, model, range(1), generator)
    calls: list[str] = []
    monkeypatch.setattr(recorder, "_register_watched", lambda name, *a: calls.append(name))
    _train(recorder, model, range(1, 4), generator)
    assert calls == []
    recorder.finalize()
    service = RecordingService(store_root / GROUP)
    try:
        assert sorted({r["training_step"] for r in service.group.trial(TRIAL).steps().to_pylist()}) == [0]
    finally:
        service.close()


def test_evaluation_under_no_grad_records_values_without_touching_requires_grad(
        make_recorder, store_root, tiny_gpt2, generator) -> None:
    model = tiny_gpt2(n_layer=2).eval()
    recorder = make_recorder({0})
    comgra.watch(model, recorder=recorder, name="gpt")
    outputs: list[torch.Tensor] = []
    model.transformer.h[0].register_forward_hook(lambda m, a, out: outputs.append(out))
    ids = torch.randint(0, 32, (B, T), generator=generator)
    recorder.start_batch(0, B, type_of_execution="evaluation")
    recorder.start_iteration()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    recorder.finish_iteration()  # no warning about unconnected tensors: pytest makes warnings errors
    recorder.finish_batch()
    recorder.finalize()
    assert not outputs[0].requires_grad and not logits.requires_grad
    service = RecordingService(store_root / GROUP)
    try:
        rows = service.tensor_rows(TRIAL, 0, node="gpt[logits]", aggregation="sample", sample=0).to_pylist()
    finally:
        service.close()
    assert [r["kind"] for r in rows] == ["forward"]
    assert rows[0]["mean"] == pytest.approx(float(logits[0].mean()), rel=1e-4, abs=1e-7)


class Shared(torch.nn.Module):
    """One layer called twice, an integer output, a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.layer(self.layer(x))
        return {"y": y, "argmax": y.argmax(dim=1)}


def test_repeated_calls_dict_outputs_and_integer_outputs(make_recorder, store_root, generator) -> None:
    model = Shared()
    recorder = make_recorder({0})
    comgra.watch(model, recorder=recorder)
    recorder.start_batch(0, B)
    for _ in range(2):  # the count starts again in each iteration
        recorder.start_iteration()
        x = torch.randn(B, 4, generator=generator)
        model(x)["y"].sum().backward()
        recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    nodes, edges, _ = _graph(store_root, 0, 1)
    assert {"model.layer", "model.layer@2", "model[y]"} <= nodes and "model[argmax]" not in nodes
    assert {("model.layer", "model.layer@2"), ("model.layer@2", "model[y]")} <= edges


@pytest.mark.parametrize(("options", "expected"), [
    ({}, ["", "transformer", "transformer.h.0", "transformer.h.0.attn", "lm_head"]),
    ({"max_depth": 0}, [""]),
    ({"max_depth": 1}, ["", "transformer", "lm_head"]),
    ({"include": "transformer.h.?"}, ["transformer.h.0", "transformer.h.1"]),
    ({"include": ["transformer.h.*"], "exclude": ["*dropout", "*.attn.*"]}, ["transformer.h.0", "transformer.h.1.mlp.c_fc"]),
], ids=["all", "depth 0", "depth 1", "include", "include and exclude"])
def test_which_modules_are_watched(make_recorder, tiny_gpt2, options: dict, expected: list[str]) -> None:
    model = tiny_gpt2(n_layer=2)
    handle = comgra.watch(model, recorder=make_recorder(), **options)
    assert set(expected) <= set(handle.modules)
    if "include" in options or "max_depth" in options:
        if options.get("max_depth") is not None:
            assert all(p.count(".") + 1 <= options["max_depth"] for p in handle.modules if p)
        if "include" in options:
            assert "" not in handle.modules
    if "exclude" in options:
        assert not any(p.endswith("dropout") or ".attn." in p for p in handle.modules)


def test_hooks_are_on_during_recorded_steps_only_and_come_off(make_recorder, tiny_gpt2) -> None:
    """Outside a recorded step the model runs exactly as without comgra: no hook on any module."""
    def hooked(model: Any) -> int:
        return sum(len(m._forward_hooks) for m in model.modules())

    model = tiny_gpt2(n_layer=2)
    recorder = make_recorder({0, 2})
    handle = comgra.watch(model, recorder=recorder)
    seen = []
    for step in range(3):
        recorder.start_batch(step, B)
        seen.append(hooked(model))
        recorder.start_iteration()
        recorder.finish_iteration()
        recorder.finish_batch()
        seen.append(hooked(model))
    assert seen == [len(handle.modules), 0, 0, 0, len(handle.modules), 0] and len(handle.modules) > 30
    handle.remove()
    assert not handle.active
    recorder.start_batch(3, B)  # removed: no hooks, whatever the policy says
    assert hooked(model) == 0
    recorder.finish_batch()
    with comgra.watch(model, recorder=make_recorder({0}, trial_id="t2"), track_parameters=False) as second:
        second.recorder.start_batch(0, B)
        assert hooked(model) == len(second.modules)
    assert hooked(model) == 0 and not second.active  # removed at the end of the with block, mid-step
    third = make_recorder({0}, trial_id="t3")
    comgra.watch(model, recorder=third, track_parameters=False)
    third.start_batch(0, B)
    third.finalize()
    assert hooked(model) == 0


def test_comgra_off_installs_no_hooks(make_recorder, tiny_gpt2) -> None:
    model = tiny_gpt2(n_layer=2)
    recorder = make_recorder(comgra_is_active=False)
    handle = comgra.watch(model, recorder=recorder)
    recorder.start_batch(0, B)
    assert not handle.active and sum(len(m._forward_hooks) for m in model.modules()) == 0


def test_the_global_recorder_is_the_default(make_recorder, tiny_gpt2) -> None:
    comgra.my_recorder = make_recorder()
    handle = comgra.watch(tiny_gpt2(n_layer=1), name="gpt")
    assert handle.recorder is comgra.my_recorder and handle.name == "gpt"
    assert comgra.my_recorder.get_name_of_module(handle.model) == "gpt"


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"include": "transformer.h.*.atn"}, ConfigError, r"'transformer.h.\*.atn' matches no module.*did you mean"),
    ({"exclude": ["nothing_like_this"]}, ConfigError, r"exclude pattern 'nothing_like_this'"),
    ({"max_depth": -1}, ConfigError, r"max_depth=-1 must be None"),
    ({"name": "my.model"}, ConfigError, r"name='my.model' must be .* without '\.'"),
    ({"include": [3]}, ConfigError, r"got an item of type int"),
], ids=["include typo", "exclude nothing", "negative depth", "dotted name", "not a pattern"])
def test_misuse_names_the_value_and_the_fix(make_recorder, tiny_gpt2, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        comgra.watch(tiny_gpt2(n_layer=1), recorder=make_recorder(), **kwargs)


def test_misuse_without_a_recorder_twice_or_mid_step(make_recorder, tiny_gpt2) -> None:
    model = tiny_gpt2(n_layer=1)
    with pytest.raises(RecordingError, match=r"set comgra.my_recorder = ComgraRecorder"):
        comgra.watch(model)
    recorder = make_recorder()
    comgra.watch(model, recorder=recorder)
    with pytest.raises(RecordingError, match=r"already watched as 'model'; call remove\(\)"):
        comgra.watch(model, recorder=recorder)
    other = tiny_gpt2(n_layer=1)
    recorder.start_batch(0, B)
    with pytest.raises(RecordingError, match=r"before the first start_batch\(\), or pass track_parameters=False"):
        comgra.watch(other, recorder=recorder, name="other")
    recorder.finish_batch()
    recorder.track_module("tracked", other)
    with pytest.raises(ConfigError, match=r"name='renamed', but the model is tracked as 'tracked'"):
        comgra.watch(other, recorder=recorder, name="renamed")
