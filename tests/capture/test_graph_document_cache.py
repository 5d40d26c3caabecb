"""A step whose graph is the same as an earlier step's reuses that step's document; any difference
(another edge, another role) gives a document of its own, equal to one built from scratch."""
from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra.capture import iteration_graph  # noqa: E402
from comgra.capture import step as step_module  # noqa: E402

B = 4


def _record(recorder: Any, model: torch.nn.Module, generator: torch.Generator, step: int, residual: bool) -> None:
    recorder.start_batch(step, B)
    recorder.start_iteration()
    x = torch.randn(B, 3, generator=generator)
    recorder.register_tensor("x", x, is_input=True)
    hidden = model.l0(x)
    recorder.register_tensor("hidden", hidden)
    y = model.l1(hidden) + (x if residual else 0)
    recorder.register_tensor("y", y)
    loss = (y ** 2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()


def test_same_graph_reuses_the_document_and_a_changed_one_is_built_afresh(
        make_recorder, open_trial, generator, edges, monkeypatch) -> None:
    iteration_graph._DOCUMENTS.clear()
    returned: list[dict[str, Any]] = []
    fresh: list[dict[str, Any]] = []
    original = step_module.StepRecording._document

    def checked(self: Any, targets: list, graph_edges: set, groups: dict[str, str]) -> tuple[dict[str, Any], list]:
        document, unconnected = original(self, targets, graph_edges, groups)
        keys = {r.key for r in targets} | {k for edge in graph_edges for k in edge}
        returned.append(document)
        fresh.append(self._new_document(targets, keys, graph_edges, groups)[0])
        return document, unconnected

    monkeypatch.setattr(step_module.StepRecording, "_document", checked)
    model = torch.nn.Module()
    model.add_module("l0", torch.nn.Linear(3, 3))
    model.add_module("l1", torch.nn.Linear(3, 3))
    recorder = make_recorder({0, 1, 2, 3})
    recorder.track_module("m", model)
    for step, residual in enumerate((False, False, True, False)):
        _record(recorder, model, generator, step, residual)
    recorder.finalize()

    assert returned == fresh  # what the cache hands back is what building it would give
    assert returned[1] is returned[0] and returned[3] is returned[0]  # reused, not rebuilt
    assert returned[2]["hash"] != returned[0]["hash"]
    trial = open_trial()
    assert ("x", "y") in edges(trial, 2, 0) and ("x", "y") not in edges(trial, 3, 0)
