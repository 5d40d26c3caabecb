"""DTensors in one process (a real gloo process group of one rank): the statistics that capture/shards.py and
capture/sharded.py make from a shard are those comgra records for the same values as a plain tensor; what cannot
be combined is named in a warning; wrapped models keep their parameters' names. The 2-rank runs are in
tests/distributed/test_sharded_statistics.py."""
from __future__ import annotations

import math
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from comgra.objects import DecisionMakerForRecordingsHardcoded  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

STATISTICS = ("mean", "abs_mean", "std", "min", "max", "abs_max", "nan_count", "inf_count")


@pytest.fixture
def one_rank() -> Iterator[Any]:
    """A gloo process group of one rank and its device mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _record(folder: str, tensors: dict[str, tuple[torch.Tensor, int | None]], batch: int) -> list[dict[str, Any]]:
    recorder = ComgraRecorder(folder, "group", "trial", DecisionMakerForRecordingsHardcoded({0}), flush_seconds=60.0,
                              max_num_neurons_to_record=6, resource_seconds=None)
    recorder.start_batch(0, batch)
    recorder.start_iteration()
    loss = torch.zeros(())
    for name, (tensor, batch_dim) in tensors.items():
        recorder.register_tensor(name, tensor, index_of_batch_dimension=batch_dim)
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        loss = loss + (torch.nan_to_num(local, nan=0.5, posinf=2.0, neginf=-2.0) ** 2).sum()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    group = GroupReader(f"{folder}/group")
    try:
        return group.trial("trial").selection(training_step=0).to_pylist()
    finally:
        group.close()


@pytest.mark.parametrize("batch_dim", [0, 1, None])
@pytest.mark.parametrize("width", [3, 40, 20_000])
@pytest.mark.parametrize("planted", ["none", "nan", "inf", "both"])
def test_a_dtensor_is_recorded_as_its_values_are_in_a_plain_tensor(one_rank: Any, batch_dim: int | None, width: int,
                                                                   planted: str) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor
    values = torch.from_numpy(np.random.default_rng(width).standard_normal((4, width)).astype(np.float32)) + 3.0
    if planted in ("nan", "both"):
        values[1, width // 2] = math.nan
    if planted in ("inf", "both"):
        values[2 if planted == "inf" else 1, 0] = -math.inf
    if batch_dim == 1:
        values = values.t().contiguous()
    sharded = distribute_tensor(values.clone(), one_rank, [Shard(1 if values.dim() > 1 else 0)])
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tensors with no connection: helpers of this test
        rows = _record(folder, {"plain": (values.clone(), batch_dim), "sharded": (sharded, batch_dim)}, batch=4)
    keyed: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {"plain": {}, "sharded": {}}
    for row in rows:
        if row["tensor_name"] in keyed:
            keyed[row["tensor_name"]][(row["kind"], row["aggregation"], row["sample"])] = row
    assert keyed["sharded"].keys() == keyed["plain"].keys() and len(keyed["plain"]) >= 2
    for key, plain in keyed["plain"].items():
        mine = keyed["sharded"][key]
        assert [mine[s] for s in STATISTICS] == pytest.approx([plain[s] for s in STATISTICS], rel=1e-6, abs=1e-6,
                                                              nan_ok=True), key
        assert mine["neurons"] == pytest.approx(plain["neurons"], nan_ok=True), key


def test_a_placement_comgra_cannot_combine_is_named_in_a_warning(one_rank: Any) -> None:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard
    strided = DTensor.from_local(torch.randn(4, 6), one_rank, [_StridedShard(0, split_factor=2)], run_check=False)
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = _record(folder, {"strided": (strided, 0)}, batch=4)
    messages = [str(w.message) for w in caught if "'strided'" in str(w.message) and "cannot summarise" in str(w.message)]
    assert len(messages) == 1 and "_StridedShard" in messages[0], messages
    assert not [r for r in rows if r["tensor_name"] == "strided"]


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch.compile's import
def test_wrapped_models_keep_the_models_parameter_names(one_rank: Any) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    for wrapped in (torch.nn.parallel.DistributedDataParallel(model), torch.compile(model),
                    torch.compile(torch.nn.parallel.DistributedDataParallel(model))):
        with tempfile.TemporaryDirectory() as folder:
            recorder = ComgraRecorder(folder, "group", "trial", DecisionMakerForRecordingsHardcoded({0}),
                                      resource_seconds=None)
            recorder.track_module("model", wrapped)
            assert list(recorder.modules.parameters) == ["model.0.weight", "model.0.bias", "model.1.weight",
                                                         "model.1.bias"], type(wrapped)
            assert recorder.get_name_of_module(wrapped) == recorder.get_name_of_module(model) == "model"
            recorder.finalize()


def test_dtensors_are_left_out_with_a_warning_where_not_every_rank_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """record_ranks='zero' in a run of 2 ranks: the other rank would never come to the collectives, so comgra
    makes none and says why (once), instead of waiting."""
    from comgra.capture import sharded
    monkeypatch.setattr(sharded, "_world_size", lambda: 2)
    said: list[tuple[str, str]] = []
    combiner = sharded.ShardCombiner.for_ranks(frozenset({0}), lambda key, message: said.append((key, message)))
    assert combiner.combine(0, [], False) == [] and combiner.combine(1, [], False) == []
    assert combiner.group is None and combiner.collectives == 0
    assert len({key for key, _ in said}) == 1 and "record_ranks='all'" in said[0][1]
    assert sharded.ShardCombiner.for_ranks(frozenset({0, 1}), None).off is None
    assert sharded.ShardCombiner.for_ranks(None, None).off is None
