"""The first recorded step's one-time costs are paid when the recorder starts, not inside the step."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra.recorder import ComgraRecorder

    recorder = ComgraRecorder(comgra_root_path=sys.argv[1], group="g", trial_id="t",
                              decision_maker_for_recordings=DecisionMakerForRecordingsFrequencyPerType(1))
    model = torch.nn.Linear(64, 8)
    recorder.track_module("model", model)
    before = set(sys.modules)
    recorder.start_batch(0, 4)
    recorder.start_iteration()
    x = torch.randn(4, 64)
    recorder.register_tensor("x", x, is_input=True)
    loss = model(x).square().mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    loss.backward()
    recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    recorder.finish_batch()
    imported = sorted(name for name in set(sys.modules) - before if name.split(".")[0] in ("pandas", "pyarrow"))
    recorder.finalize()
    print(json.dumps(imported))
""")


def test_no_heavy_import_lands_in_the_first_recorded_step(tmp_path: Path) -> None:
    """pyarrow imports pandas at its first conversion of any value (0.4 s of CPU): measured inside the
    first recorded step of the ResNet-18 benchmark before ``summaries.prepare`` ran at the start."""
    completed = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout.strip().splitlines()[-1]) == []
