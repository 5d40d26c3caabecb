"""benchmarks/long_run.py and benchmarks/long_run_controls.py run one training loop, not two copies.

The controls tell comgra's share of the long run's memory from torch's only if their "full" mode is
the long run's loop; two copies drifted apart once already (one timed the import of torch._dynamo,
the other did not).
"""
from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def long_run(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import long_run
    return long_run


def test_the_long_run_trains_with_the_controls_full_loop(long_run, tmp_path: Path, monkeypatch) -> None:
    import long_run_controls
    from comgra.store import GroupReader

    modes = []

    def spy(mode, root, every, writer_options=None):
        modes.append(mode)
        return long_run_controls.make_step(mode, root, every, writer_options)

    monkeypatch.setattr(long_run, "make_step", spy)
    memory, seconds, cpu = long_run.train(tmp_path, 200, 100)
    assert modes == ["full"]
    assert len(memory) == 100 and memory[-1][0] == 200  # a sample at every hundredth of the run
    assert seconds > 0 and cpu > 0
    trial = GroupReader(tmp_path / "long").trial("trial")
    assert trial.steps()["training_step"].to_pylist() == [0, 100]  # one step in 100 recorded
    assert trial.kpis().num_rows == 200  # a KPI on every step


def test_the_controls_torch_mode_has_no_recorder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import long_run_controls

    loop = long_run_controls.make_step("torch", tmp_path, 100)
    loop.step(0)
    loop.finish()
    assert loop.recorder is None and not any(tmp_path.iterdir())
