"""Shared fixtures: a tiny model, a seeded generator, a fresh store per test.

Every recording goes to the test's own ``tmp_path``; nothing is shared between tests.
Recorders made through ``make_recorder`` are finalized at teardown, so no writer
thread outlives its test. torch is imported only by the fixtures that need it, so
tests of the store and the server run without it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import comgra
from comgra.store import GroupReader, TrialReader

GROUP = "group"
TRIAL = "trial"


@pytest.fixture(autouse=True)
def _no_global_recorder() -> Iterator[None]:
    """Tests that set ``comgra.my_recorder`` (as the README does) must not leak it."""
    previous = comgra.my_recorder
    yield
    comgra.my_recorder = previous


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync costs tens of milliseconds per chunk on a busy disk and proves nothing in a test that does not
    cut the power; tests/store/test_writer.py checks that it is on by default."""
    from comgra.store import format as fmt

    monkeypatch.setattr(fmt, "DURABLE_WRITES", False, raising=False)


@pytest.fixture(scope="session")
def _findings_key_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("comgra_config")


@pytest.fixture(autouse=True)
def _own_findings_key(monkeypatch: pytest.MonkeyPatch, _findings_key_folder: Path) -> None:
    """The key that signs saved findings (comgra.analysis.findings_key) lives in a folder of the test session,
    never in the user's own config folder; subprocesses inherit it."""
    monkeypatch.setenv("COMGRA_CONFIG_DIR", str(_findings_key_folder))


@pytest.fixture
def generator() -> Any:
    """A seeded ``torch.Generator``: test data never depends on the global RNG."""
    torch = pytest.importorskip("torch")
    return torch.Generator().manual_seed(1234)


def make_tiny_model(seed: int = 0, in_features: int = 3, hidden: int = 4, out_features: int = 2) -> Any:
    """Linear -> tanh -> Linear, with weights that depend on ``seed`` only."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(in_features, hidden), torch.nn.Tanh(),
                                   torch.nn.Linear(hidden, out_features))


@pytest.fixture
def tiny_model() -> Any:
    pytest.importorskip("torch")
    return make_tiny_model()


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    """``comgra_root_path`` of a fresh store; recordings land in ``store_root / GROUP``."""
    root = tmp_path / "store"
    root.mkdir()
    return root


@pytest.fixture
def make_recorder(store_root: Path) -> Iterator[Callable[..., Any]]:
    """``make_recorder(steps={0, 2}, trial_id=..., policy=..., **ComgraRecorder kwargs)``, finalized at teardown."""
    pytest.importorskip("torch")
    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    made: list[Any] = []

    def make(steps: set[int] | None = None, *, trial_id: str = TRIAL, policy: Any = None, **kwargs: Any) -> Any:
        if policy is None:
            policy = DecisionMakerForRecordingsHardcoded({0} if steps is None else steps)
        kwargs.setdefault("flush_seconds", 0.05)
        recorder = ComgraRecorder(store_root, GROUP, trial_id, policy, **kwargs)
        made.append(recorder)
        return recorder

    yield make
    for recorder in made:
        recorder.finalize()


@pytest.fixture
def open_trial(store_root: Path) -> Callable[..., TrialReader]:
    """A fresh reader of a trial in the test's store (fresh, so it sees everything written)."""

    def open_(trial_id: str = TRIAL) -> TrialReader:
        return GroupReader(store_root / GROUP).trial(trial_id)

    return open_


def graph_of(trial: TrialReader, training_step: int, iteration: int) -> dict[str, Any]:
    rows = [r for r in trial.steps().to_pylist()
            if r["training_step"] == training_step and r["iteration"] == iteration]
    assert len(rows) == 1, f"step {training_step} iteration {iteration}: {len(rows)} rows in the steps index"
    return trial.graph(rows[0]["graph"])


@pytest.fixture
def graph() -> Callable[[TrialReader, int, int], dict[str, Any]]:
    """The dependency graph document of one (training_step, iteration)."""
    return graph_of


@pytest.fixture
def edges() -> Callable[[TrialReader, int, int], set[tuple[str, str]]]:
    """Node-level edges ``{(source, target)}`` of one iteration's dependency graph."""
    return lambda trial, step, iteration: {
        (e["source"], e["target"]) for e in graph_of(trial, step, iteration)["edges"]}


@pytest.fixture
def node_roles() -> Callable[[TrialReader, int, int], dict[str, str]]:
    """``{node id: role}`` of one iteration's dependency graph."""
    return lambda trial, step, iteration: {
        n["id"]: n["role"] for n in graph_of(trial, step, iteration)["nodes"]}


def record_step(recorder: Any, step: int, batch_size: int, forward: Callable[[Any], Any], *,
                optimizer: Any = None, decide: tuple[str | None, list[str]] | None = None,
                **start_batch_kwargs: Any) -> Any:
    """One training step through the documented loop (start_batch ... finish_batch); returns the loss.

    ``forward(recorder)`` registers the step's tensors and returns the loss to backpropagate, or None
    for a step without a backward pass. ``optimizer`` is zeroed before and stepped after the backward
    pass; ``decide`` is ``(type_of_execution, categories)`` of a dynamic recording, decided after the
    iteration.
    """
    recorder.start_batch(step, batch_size, **start_batch_kwargs)
    recorder.start_iteration()
    loss = forward(recorder)
    if loss is not None:
        if optimizer is not None:
            optimizer.zero_grad()
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        recorder.record_current_gradients("gradients")
    recorder.finish_iteration()
    if decide is not None:
        recorder.decide_recording_of_batch(*decide)
    recorder.finish_batch()
    return loss


def model_forward(model: Any, x: Any) -> Callable[[Any], Any]:
    """A ``forward`` for ``record_step``: registers the input ``x``, ``y = model(x)`` and ``loss = mean(y**2)``."""

    def forward(recorder: Any) -> Any:
        recorder.register_tensor("x", x, is_input=True)
        y = model(x)
        recorder.register_tensor("y", y)
        loss = y.pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        return loss

    return forward


@pytest.fixture(name="record_step")
def _record_step() -> Callable[..., Any]:
    """``record_step(recorder, step, batch_size, forward, optimizer=, decide=, **start_batch kwargs)``."""
    return record_step


@pytest.fixture(name="model_forward")
def _model_forward() -> Callable[..., Any]:
    """``model_forward(model, x)``: the usual input -> model -> squared-mean loss of a recorded step."""
    return model_forward


def load_benchmark_script(name: str):
    """A script under benchmarks/ (not a package), imported by path once per session."""
    import importlib.util
    import sys

    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def synthetic():
    """The torch-free recording generator of benchmarks/synthetic_recording.py."""
    return load_benchmark_script("synthetic_recording")


@pytest.fixture(scope="session")
def sweep_groups():
    """benchmarks/sweep_groups.py: groups shaped like a hyper-parameter sweep, recorded with comgra's recorder."""
    pytest.importorskip("torch")
    return load_benchmark_script("sweep_groups")


@pytest.fixture(scope="session")
def app_latency():
    """benchmarks/app_latency.py, whose Dash client the HTTP and CLI tests use."""
    return load_benchmark_script("app_latency")


@pytest.fixture(scope="session")
def recording(tmp_path_factory, synthetic) -> Path:
    """Two synthetic trials, 12 recorded steps each; read-only for the tests that share it."""
    return synthetic.write_recording(tmp_path_factory.mktemp("recording"), synthetic.Options(scale=0.05, steps_per_chunk=5))


@pytest.fixture
def fresh_recording(tmp_path, synthetic) -> Path:
    """One synthetic trial of 5 recorded steps, for tests that damage or extend it."""
    return synthetic.write_recording(tmp_path, synthetic.Options(scale=0.02, trials=1, steps_per_chunk=2))
