"""The "force_eager" stance of a recorded step (comgra.capture.compiled): on from start_batch, off on every path
that ends the step, the user's own stance kept; nothing at all for a user who never imported torch.compile.

No compile here (fast): the stance itself is read from torch._dynamo; the compiled runs are in the other tests.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from comgra.capture.session import ComgraWarning  # noqa: E402


def _stance() -> str:
    from torch._dynamo import eval_frame

    return str(eval_frame._stance.stance)


def _forward(recorder: Any, model: Any, x: Any) -> Any:
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    y = model(x)
    recorder.register_tensor("y", y)
    return y


@pytest.fixture
def dynamo() -> Any:
    import torch._dynamo  # as torch.compile does

    yield torch._dynamo
    torch.compiler.set_stance("default")


def test_a_recorded_step_is_eager_from_start_to_finish_and_an_unrecorded_one_is_not(
        dynamo: Any, make_recorder: Any, tiny_model: Any) -> None:
    recorder = make_recorder({0, 2})
    x = torch.randn(4, 3, requires_grad=True)
    seen = []
    for step in range(4):
        recorder.start_batch(step, 4)
        seen.append(_stance())
        y = _forward(recorder, tiny_model, x)
        y.sum().backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
        seen.append(_stance())
    assert seen == ["force_eager", "default", "default", "default"] * 2


def test_the_users_own_stance_comes_back(dynamo: Any, make_recorder: Any, tiny_model: Any) -> None:
    recorder = make_recorder({0})
    torch.compiler.set_stance("eager_on_recompile")
    recorder.start_batch(0, 4)
    assert _stance() == "force_eager"
    _forward(recorder, tiny_model, torch.randn(4, 3, requires_grad=True))
    recorder.finish_iteration()
    recorder.finish_batch()
    assert _stance() == "eager_on_recompile"


def test_a_fault_of_comgras_ends_the_eager_step_at_once(
        dynamo: Any, make_recorder: Any, tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = make_recorder({0, 1})
    recorder.start_batch(0, 4)
    assert _stance() == "force_eager"
    monkeypatch.setattr(type(recorder.session.step), "start_iteration", _broken)
    with pytest.warns(ComgraWarning, match="internal error"):
        recorder.start_iteration()
    assert _stance() == "default" and not recorder.recording_is_active()
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.start_batch(1, 4)  # recording is off for good: no more eager steps
    assert _stance() == "default"
    recorder.start_iteration()
    recorder.finish_iteration()
    recorder.finish_batch()


def _broken(*arguments: Any) -> None:
    raise RuntimeError("a fault inside comgra")


def test_finalize_in_the_middle_of_a_recorded_step_ends_it(dynamo: Any, make_recorder: Any, tiny_model: Any) -> None:
    recorder = make_recorder({0})
    recorder.start_batch(0, 4)
    _forward(recorder, tiny_model, torch.randn(4, 3, requires_grad=True))
    assert _stance() == "force_eager"
    recorder.finalize()
    assert _stance() == "default"


def test_an_eager_user_never_imports_torch_compile(tmp_path: Path) -> None:
    code = ("import sys, torch, comgra\n"
            "from comgra.recorder import ComgraRecorder\n"
            "from comgra.objects import DecisionMakerForRecordingsHardcoded\n"
            f"r = ComgraRecorder({str(tmp_path)!r}, 'g', 't', DecisionMakerForRecordingsHardcoded({{0}}),"
            " resource_seconds=None)\n"
            "m = torch.nn.Linear(3, 2)\n"
            "r.track_module('m', m)\n"
            "for step in range(2):\n"
            "    r.start_batch(step, 4); r.start_iteration(); y = m(torch.randn(4, 3)); r.register_tensor('y', y)\n"
            "    y.sum().backward(); r.record_current_gradients('g'); r.finish_iteration(); r.finish_batch()\n"
            "r.finalize()\n"
            "print('torch._dynamo' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "False"
