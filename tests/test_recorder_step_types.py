"""A step is (training_step, type_of_execution): an evaluation may share the number of a training step (the
Trainer's global_step), each reads its own rows, and a recording made before the tensors table had the type
column reads exactly as it did."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from comgra.errors import RecordingError
from comgra.service import RecordingService
from comgra.service.selection import ANY_TYPE
from comgra.store import format as fmt

from tests.conftest import GROUP, TRIAL


def _step(recorder, step: int, kind: str, model, x: torch.Tensor) -> None:
    recorder.start_batch(step, x.shape[0], type_of_execution=kind)
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    y = model(x)
    recorder.register_tensor("y", y)
    loss = y.pow(2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    if kind == "training":
        loss.backward()
        recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()


def _mean(trial, step: int, node: str, kind: str | None = None) -> float:
    filters = {} if kind is None else {"type_of_execution": kind}
    (row,) = trial.selection(training_step=step, node=node, kind="forward", aggregation="mean", iteration=0,
                             **filters).to_pylist()
    return row["mean"]


def test_an_evaluation_shares_a_training_steps_number_and_each_reads_its_own_rows(
        make_recorder, open_trial, store_root, tiny_model, generator) -> None:
    recorder = make_recorder({0, 1, 2, 3})
    inputs = {(0, "training"): 1.0, (1, "evaluation"): 2.0, (1, "training"): 3.0, (2, "evaluation"): 4.0,
              (2, "training"): 5.0}
    for (step, kind), scale in inputs.items():  # the Trainer's order: evaluation g runs before training step g
        _step(recorder, step, kind, tiny_model, scale * torch.ones(4, 3))
    with pytest.raises(RecordingError, match="training_step=1 does not increase"):
        recorder.start_batch(1, 4, type_of_execution="evaluation")  # (1, evaluation) is recorded already
    with pytest.raises(RecordingError, match="the previous step was 2"):
        recorder.start_batch(1, 4, type_of_execution="test")  # numbers never go back, whatever the type
    recorder.finalize()

    trial = open_trial()
    assert sorted((r["training_step"], r["type_of_execution"]) for r in trial.steps().to_pylist()) == sorted(inputs)
    for (step, kind), scale in inputs.items():
        assert _mean(trial, step, "x", kind) == pytest.approx(scale)
    rows = trial.selection(training_step=1, node="x", kind="forward", aggregation="mean").to_pylist()
    assert sorted((r["type_of_execution"], r["mean"]) for r in rows) == [("evaluation", 2.0), ("training", 3.0)]
    assert trial.selection(training_step=1, node="y", kind="gradients", type_of_execution="evaluation").num_rows == 0
    series = trial.series(node="x", role="x", iteration=0, type_of_execution="evaluation")
    assert list(zip(series["training_step"].to_pylist(), series["value"].to_pylist())) == [(1, 2.0), (2, 4.0)]

    service = RecordingService(store_root / GROUP)
    try:
        index = service.step_index(trial.trial_id)
        assert index.positions(ANY_TYPE) == [(0, "training"), (1, "evaluation"), (1, "training"),
                                             (2, "evaluation"), (2, "training")]
        # The app: the slider has a position per step; each resolves to its own values.
        for position, (step, kind) in enumerate(index.positions(ANY_TYPE)):
            assert service.adjacent_position(trial.trial_id, ANY_TYPE, 0, index=position) == (step, kind)
            view = service.resolve({"trial": trial.trial_id, "training_step": step, "step_type": kind,
                                    "node_id": "x", "aggregation": "mean"})
            assert (view.selection.training_step, view.selection.step_type) == (step, kind)
            assert view.row["mean"] == pytest.approx(inputs[(step, kind)])
        # Without a type, a shared number shows the main type (the one most steps have): training.
        view = service.resolve({"trial": trial.trial_id, "training_step": 1, "node_id": "x", "aggregation": "mean"})
        assert view.selection.step_type == "training" and view.row["mean"] == pytest.approx(3.0)
        assert service.adjacent_position(trial.trial_id, ANY_TYPE, 1, offset=1, step_type="evaluation") == (1, "training")
        # Compare pins the same step (number and type) of the same tensor.
        shown = service.resolve({"trial": trial.trial_id, "training_step": 1, "step_type": "evaluation",
                                 "node_id": "x", "aggregation": "mean"}).selection
        pinned = service.counterpart(shown).selection
        assert (pinned.training_step, pinned.step_type) == (1, "evaluation")
        assert service.compare(pinned, shown).current_row["mean"] == pytest.approx(2.0)
        # The Samples tab: the rows of the step of the shown type.
        for kind, scale in (("evaluation", 2.0), ("training", 3.0)):
            columns = service.sample_columns(trial.trial_id, 1, 0, type_of_execution=kind)
            (column,) = [c for c in columns if c.node_id == "x" and c.kind == "forward"]
            table = service.samples_table(trial.trial_id, 1, 0, [column], type_of_execution=kind)
            assert table.type_of_execution == kind
            assert [r[column.key] for r in table.rows] == pytest.approx([scale] * 4)
    finally:
        service.close()


def _strip_the_type_column(store_root: Path) -> int:
    """Rewrite every tensors chunk as comgra wrote it before the column existed (the same name, the same rows)."""
    folder = store_root / GROUP / "tensors"
    count = 0
    for path in folder.rglob("*.parquet"):
        table = pq.read_table(path)
        assert "type_of_execution" in table.column_names
        fmt.write_parquet_atomic(path, table.drop_columns(["type_of_execution"]), row_group_size=fmt.TENSOR_ROW_GROUP)
        count += 1
    return count


def test_a_recording_without_the_type_column_reads_as_before(make_recorder, open_trial, store_root, tiny_model,
                                                              generator) -> None:
    recorder = make_recorder({0, 1, 2, 3})
    for step, kind in [(0, "training"), (1, "evaluation"), (2, "training"), (3, "evaluation")]:
        _step(recorder, step, kind, tiny_model, torch.randn(4, 3, generator=generator))
    recorder.finalize()

    def everything() -> dict[str, object]:
        trial = open_trial()
        rows = {}
        for step in range(4):
            table = trial.selection(training_step=step).drop_columns(["type_of_execution"])
            rows[step] = sorted(map(str, table.to_pylist()))
        typed = {kind: trial.series(node="y", role="y", iteration=0, type_of_execution=kind).to_pylist()
                 for kind in ("training", "evaluation")}
        return {"rows": rows, "steps": trial.steps().to_pylist(), "problems": trial.problems,
                "series": trial.series(node="y", role="y", iteration=0).to_pylist(), "typed": typed,
                "by_type": [trial.selection(training_step=s, type_of_execution=k).num_rows
                            for s in range(4) for k in ("training", "evaluation")]}

    before = everything()
    assert _strip_the_type_column(store_root) > 0
    after = everything()
    assert after == before
    # (step, training), (step, evaluation) for steps 0-3: each step's rows under its own type only
    assert [n > 0 for n in after["by_type"]] == [True, False, False, True, True, False, False, True]
    assert [p["training_step"] for p in after["typed"]["evaluation"]] == [1, 3]
    assert open_trial().selection(training_step=1)["type_of_execution"].null_count == \
        open_trial().selection(training_step=1).num_rows  # read as null: the step's one type


def test_the_rest_api_answers_each_step_of_a_shared_number(make_recorder, store_root, tiny_model) -> None:
    from comgra.server.app import create_app

    recorder = make_recorder({0, 1, 2})
    inputs = {(0, "training"): 1.0, (1, "evaluation"): 2.0, (1, "training"): 3.0, (2, "training"): 4.0}
    for (step, kind), scale in inputs.items():
        _step(recorder, step, kind, tiny_model, scale * torch.ones(4, 3))
    recorder.finalize()
    app = create_app(store_root / GROUP, warm_up=False)
    try:
        client = app.server.test_client()
        base = f"/api/v1/trials/{TRIAL}"
        steps = client.get(f"{base}/steps").json["steps"]
        assert sorted((r["training_step"], r["type_of_execution"]) for r in steps) == sorted(inputs)
        for (step, kind), scale in inputs.items():
            answer = client.get(f"{base}/values?step={step}&execution={kind}&node=x&aggregation=mean").json
            assert answer["values"]["mean"] == pytest.approx(scale)
            assert answer["selection"]["step_type"] == kind
            assert f"type={kind}&step={step}&" in answer["app_link"]  # the app opens this step, not its number's other
            assert client.get(f"{base}/graph?step={step}&execution={kind}").json["type_of_execution"] == kind
        # Without ?execution= a shared number answers its main type (the one most steps have), and says so.
        answer = client.get(f"{base}/values?step=1&node=x&aggregation=mean").json
        assert answer["selection"]["step_type"] == "training" and answer["values"]["mean"] == pytest.approx(3.0)
        missing = client.get(f"{base}/graph?step=0&execution=evaluation")
        assert missing.status_code == 404 and "of type 'evaluation'" in missing.json["error"]["message"]
        series = client.get(f"{base}/series?node=x&role=x&iteration=0&execution=evaluation").json
        assert (series["training_step"], series["value"]) == ([1], [pytest.approx(2.0)])
    finally:
        app.server.config.clear()
