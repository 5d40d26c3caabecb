"""record_hyperparameters: flattened, checked, merged; stored as a document and as a Hive-partitioned table."""
from __future__ import annotations

import duckdb
import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from comgra.errors import ComgraError, RecordingError
from comgra.store import hyperparameters as store
from tests.conftest import GROUP, TRIAL


def _engine_rows(group_dir) -> list[tuple]:
    with duckdb.connect() as connection:
        return connection.execute(
            f"SELECT trial, rank, name, value, number FROM read_parquet('{group_dir}/hyperparameters/**/*.parquet', "
            "hive_partitioning=true) ORDER BY trial, name").fetchall()


def test_nested_values_are_flattened_merged_and_stored_in_both_forms(make_recorder, store_root) -> None:
    recorder = make_recorder()
    recorder.record_hyperparameters({"lr": 0.1, "model": {"width": 64, "act": "relu"}, "amp": True, "seed": None})
    recorder.record_hyperparameters({"lr": np.float32(0.5), "steps": torch.tensor(7)})  # later values win
    recorder.finalize()
    trial_dir = store_root / GROUP / "trials" / TRIAL
    assert store.read(trial_dir) == {"lr": 0.5, "model.width": 64, "model.act": "relu", "amp": True, "seed": None,
                                     "steps": 7}
    assert _engine_rows(store_root / GROUP) == [
        (TRIAL, 0, "amp", "true", 1.0), (TRIAL, 0, "lr", "0.5", 0.5), (TRIAL, 0, "model.act", "relu", None),
        (TRIAL, 0, "model.width", "64", 64.0), (TRIAL, 0, "seed", None, None), (TRIAL, 0, "steps", "7", 7.0)]


def test_a_trial_id_with_odd_characters_reads_back_through_the_partition(make_recorder, store_root) -> None:
    recorder = make_recorder(trial_id="lr=0.1,seed 3%")
    recorder.record_hyperparameters({"lr": 0.1})
    recorder.finalize()
    assert _engine_rows(store_root / GROUP) == [("lr=0.1,seed 3%", 0, "lr", "0.1", 0.1)]


BAD = {
    "a_list": ({"layers": [1, 2]}, "'layers' is list"),
    "an_object": ({"opt": {"fn": object()}}, "'opt.fn' is object"),
    "a_vector_tensor": ({"w": torch.ones(3)}, "'w' is Tensor"),
    "not_a_mapping": ([("lr", 0.1)], "takes a mapping"),
    "a_number_key": ({1: 0.1}, "name 1"),
}


@pytest.mark.parametrize(("mapping", "named"), BAD.values(), ids=BAD.keys())
def test_other_values_are_refused_naming_the_key_and_the_fix(mapping, named, make_recorder, store_root) -> None:
    recorder = make_recorder()
    with pytest.raises(RecordingError, match=named) as raised:
        recorder.record_hyperparameters(mapping)
    assert isinstance(raised.value, ComgraError)
    assert "numbers, strings" in str(raised.value) or "e.g." in str(raised.value) or "use names" in str(raised.value)
    assert store.read(store_root / GROUP / "trials" / TRIAL) == {}


def test_an_inactive_recorder_checks_but_writes_nothing(make_recorder, store_root) -> None:
    recorder = make_recorder(comgra_is_active=False)
    recorder.record_hyperparameters({"lr": 0.1})
    with pytest.raises(RecordingError):
        recorder.record_hyperparameters({"lr": [0.1]})
    assert not (store_root / GROUP / "hyperparameters").exists()


def test_an_unwritable_folder_warns_and_training_goes_on(make_recorder, store_root, monkeypatch) -> None:
    from comgra.capture.session import ComgraWarning

    recorder = make_recorder()

    def refuse(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(store, "write", refuse)
    with pytest.warns(ComgraWarning, match="cannot write the hyperparameters.*disk full"):
        recorder.record_hyperparameters({"lr": 0.1})
    recorder.start_batch(0, 1)
    recorder.finish_batch()
