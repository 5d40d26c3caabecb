"""The naming columns of a step's rows are built once per layout and reused (capture/summaries.py):
a step whose tensors, samples or categories differ from the last one's must not get its names."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from comgra.recorder import ComgraRecorder
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.store import format as fmt
from comgra.store import layout


def test_rows_name_what_each_step_registered(tmp_path, record_step) -> None:
    recorder = ComgraRecorder(comgra_root_path=str(tmp_path), group="g", trial_id="t",
                              decision_maker_for_recordings=DecisionMakerForRecordingsFrequencyPerType(1),
                              max_num_batch_size_to_record=2)
    layer = torch.nn.Linear(3, 4)
    recorder.track_module("layer", layer)
    registered: dict[int, dict[str, float]] = {}

    def forward(step: int):
        def run(rec):
            x = torch.full((4, 3), float(step))
            rec.register_tensor("x", x, is_input=True)
            y = layer(x)
            rec.register_tensor("y" if step != 2 else "other", y)  # step 2: another name, same layout otherwise
            extra = {}
            if step == 3:  # step 3: one tensor more
                z = y * 2
                rec.register_tensor("z", z)
                extra["z"] = float(z.detach().mean())
            loss = (y ** 2).mean()
            rec.register_tensor("loss", loss, is_loss=True)
            registered[step] = {"x": float(step), ("y" if step != 2 else "other"): float(y.detach().mean()),
                                "loss": float(loss.detach()), **extra}
            return loss
        return run

    for step in range(5):
        record_step(recorder, step, 4, forward(step))
    recorder.finalize()
    table = pq.read_table(layout.rank_dir(fmt.trial_dir(tmp_path / "g", "t"), "tensors", 0)).to_pandas()
    rows = table[(table.kind == "forward") & (table.tensor_type != "parameter")
                 & table.aggregation.isin(["mean", "none"])]
    for step, expected in registered.items():
        got = rows[rows.training_step == step].set_index("tensor_name")["mean"]
        assert sorted(got.index) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)
