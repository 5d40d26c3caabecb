"""A recorded step's last statistics and rows are built on the writer's thread where every value is on the CPU
(capture/step.py, ``LaterRows``; store/writer.py, ``put_later``). What is recorded must be the same as when the
training thread builds them: the same training recorded twice, once with every step's rows built on the training
thread and once with every one built on the writer's, gives equal tables and graphs (the run evidence's rows,
capture/evidence.py, go the same way)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from comgra.capture import step as step_module  # noqa: E402
from comgra.store import writer as writer_module  # noqa: E402

B = 5


class Tagged(torch.Tensor):
    """A user's tensor subclass (no ``__torch_dispatch__`` of its own)."""


def _model() -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = torch.nn.Module()
        model.add_module("encode", torch.nn.Linear(6, 8))
        model.add_module("cell", torch.nn.Linear(8, 8))
        model.add_module("left", torch.nn.Linear(8, 8))
        model.add_module("right", torch.nn.Linear(8, 8))
        model.add_module("head", torch.nn.Linear(8, 3))
    return model


def _train(recorder: Any, steps: int) -> None:
    """Three recurrent iterations per step; a branch that the data decides; a custom tensor; an in-place op after
    a registration; Adam."""
    model = _model()
    recorder.track_module("net", model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(11)
    for step in range(steps):
        recorder.start_batch(step, B)
        xs = torch.randn(3, B, 6, generator=generator).unbind()
        recorder.register_tensor("h_0", torch.zeros(B, 8), is_initial_value=True)
        hidden = torch.zeros(B, 8)
        optimizer.zero_grad()
        total = torch.zeros(())
        for iteration in range(3):
            recorder.start_iteration()
            x = xs[iteration].clone()
            recorder.register_tensor("x", x, is_input=True)
            encoded = model.encode(x) + model.cell(hidden)
            recorder.register_tensor("encoded", encoded)
            encoded.relu_()  # changed in place after its registration: the registered value is recorded
            branch = model.left if float(encoded.detach().sum()) > 0 else model.right  # the data decides
            hidden = torch.tanh(branch(encoded))
            recorder.register_tensor("hidden", hidden)
            custom = (hidden * 2).as_subclass(Tagged)
            recorder.register_tensor("custom", custom, node_name="extra", role_within_node="doubled")
            out = model.head(custom)
            loss = out.pow(2).mean()
            recorder.register_tensor("loss", loss, is_loss=True)
            total = total + loss
            if iteration < 2:
                recorder.finish_iteration()
        total.backward()
        optimizer.step()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()


def _same_nan(value: Any) -> Any:
    """NaN as a string, so that two equal rows compare equal (NaN != NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, list):
        return [_same_nan(v) for v in value]
    return value


def _tables(group: Path, trial: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in ("tensors", "steps", "runinfo"):
        paths = sorted((group / name / f"trial={trial}").rglob("*.parquet"))
        assert paths, f"no {name} chunks of {trial}"
        table = pa.concat_tables([pq.read_table(path) for path in paths])
        if "wall_time" in table.column_names:
            table = table.drop_columns(["wall_time"])
        found[name] = sorted(({key: _same_nan(value) for key, value in row.items()} for row in table.to_pylist()),
                             key=repr)
    found["graphs"] = sorted(path.read_text() for path in (group / "trials" / trial / "graphs").glob("*.json"))
    return found


def test_rows_built_on_the_writer_equal_rows_built_on_the_training_thread(
        make_recorder, store_root, monkeypatch) -> None:
    took: list[tuple[tuple[str, ...], int]] = []
    original = writer_module.ChunkWriter.put_later

    def counted(self: Any, names: tuple[str, ...], make: Any, size: int) -> None:
        took.append((names, size))
        original(self, names, make, size)

    monkeypatch.setattr(writer_module.ChunkWriter, "put_later", counted)
    monkeypatch.setattr(writer_module.ChunkWriter, "takes_later", lambda self, size: False)
    _train(make_recorder(set(range(6)), trial_id="here"), 6)
    assert took == []  # the training thread built every step's rows
    monkeypatch.setattr(writer_module.ChunkWriter, "takes_later", lambda self, size: True)
    _train(make_recorder(set(range(6)), trial_id="later"), 6)
    assert sorted(names for names, _ in took) == [("runinfo",)] * 6 + [("tensors", "steps")] * 6
    assert all(0 < size <= step_module.LATER_UP_TO_BYTES for _, size in took)

    group = next(path.parent for path in store_root.rglob("trials") if path.is_dir())
    here, later = _tables(group, "here"), _tables(group, "later")
    assert len(here["tensors"]) > 100 and {r["iteration"] for r in here["steps"]} == {0, 1, 2}
    assert len(here["graphs"]) >= 2  # the branch taken shows in the graphs
    assert {r["tensor_name"] for r in here["tensors"]} >= {"encoded", "hidden", "custom", "loss", "h_0"}
    assert {r["kind"] for r in here["tensors"]} == {"forward", "gradients"}
    assert {r["field"] for r in here["runinfo"]} >= {"value_sum", "value_norm", "grad_norm", "dtype", "mode"}
    assert here == later


def test_a_live_tensor_or_a_spectral_norm_is_never_left_for_the_writer() -> None:
    from comgra.capture.registry import Registration
    copy = torch.randn(4, 3)
    live = Registration("w", -1, "w", "w", "parameter", "neuron", None, False, (4, 3), copy)
    kept = Registration("a", 0, "a", "a", "calculated", "neuron", 0, True, (4, 3), torch.randn(4, 3))
    svd = Registration("s", 0, "s", "s", "calculated", "kpis_and_svd", None, False, (4, 3), torch.randn(4, 3))
    assert step_module.later_size([(kept, copy)], [], with_svd=False) == copy.nbytes
    assert step_module.later_size([(live, copy)], [], with_svd=False) is None  # the user's own tensor: it changes
    assert step_module.later_size([(svd, copy)], [], with_svd=False) is None
    elsewhere = torch.empty(4, 3, device="meta")  # not in the CPU's memory (as a GPU's): summarised on its own thread
    assert step_module.later_size([(kept, elsewhere)], [], with_svd=False) is None
    big = torch.zeros(step_module.LATER_UP_TO_BYTES // 4 + 1)
    assert step_module.later_size([(kept, big)], [], with_svd=False) is None


def test_a_fault_in_the_evidence_rows_on_the_writer_stops_the_evidence_only(
        make_recorder, open_trial, monkeypatch) -> None:
    from comgra.capture import evidence
    from comgra.capture.session import ComgraWarning

    def broken(self: Any, rows: list, of_step: tuple) -> Any:
        raise ValueError("planted")

    monkeypatch.setattr(evidence.RunEvidence, "_table", broken)
    monkeypatch.setattr(writer_module.ChunkWriter, "takes_later", lambda self, size: True)
    with pytest.warns(ComgraWarning, match="stopped keeping the run's evidence.*planted"):
        _train(make_recorder(set(range(4))), 4)  # said at the next step's start; the training and recording go on
    assert sorted({r["training_step"] for r in open_trial().steps().to_pylist()}) == [0, 1, 2, 3]
