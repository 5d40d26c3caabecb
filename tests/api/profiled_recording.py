"""A small recording with profiled layers, KPIs, notes and resource samples, for the API and app tests.

The model has known nesting and known sleeps in its forward passes, so the expected times are
known: ``net.b1.a`` sleeps SLEEP_A, ``net.b1.b`` sleeps SLEEP_B, ``net.b1`` sleeps SLEEP_B1 itself.
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SLEEP_A, SLEEP_B, SLEEP_B1 = 0.010, 0.020, 0.005
GROUP, TRIAL = "group", "trial"


def nested_model():
    import torch

    class Sleeper(torch.nn.Module):
        def __init__(self, seconds: float):
            super().__init__()
            self.seconds = seconds
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            time.sleep(self.seconds)
            return torch.relu(self.lin(x))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Sleeper(SLEEP_A), Sleeper(SLEEP_B)

        def forward(self, x):
            time.sleep(SLEEP_B1)
            return self.b(self.a(x))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.b1 = Block()
            self.head = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.head(self.b1(x))

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Net()


def record(root: Path, *, steps: int = 4, resource_seconds: float | None = 0.05, **recorder_options) -> Path:
    """Train ``steps`` steps of the nested model with profiling on; returns the group folder."""
    import torch

    from comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra.recorder import ComgraRecorder

    net = nested_model()
    recorder = ComgraRecorder(root, GROUP, TRIAL, DecisionMakerForRecordingsHardcoded(fixed_training_steps={0, 2}),
                              resource_seconds=resource_seconds, **recorder_options)
    recorder.track_module("net", net, profile=True)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(0)
    for step in range(steps):
        recorder.start_batch(step, 3)
        recorder.start_iteration()
        x = torch.randn(3, 4, generator=generator)
        recorder.register_tensor("input", x, is_input=True)
        loss = net(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        recorder.record_kpi_in_graph("loss", "loss", loss.detach())
        recorder.finish_iteration()
        loss.backward()
        recorder.record_current_gradients("gradients")
        optimizer.step()
        optimizer.zero_grad()
        recorder.finish_batch()
    recorder.add_note("done")
    time.sleep(0.15 if resource_seconds else 0)  # a few resource samples
    recorder.finalize()
    return root / GROUP


def record_without_fsync(root: Path, **options: Any) -> Path:
    """``record`` with the store's fsyncs off (a fixture's recording, copied for each test, never has to
    survive a power loss); returns the group folder."""
    from comgra.store import format as fmt

    durable, fmt.DURABLE_WRITES = fmt.DURABLE_WRITES, False
    try:
        return record(root, **options)
    finally:
        fmt.DURABLE_WRITES = durable


def copy_of_group(recorded: Path, folder: Path) -> Path:
    """A copy of the group folder ``recorded`` in ``folder``, for a test to damage."""
    shutil.copytree(recorded, folder / GROUP)
    return folder / GROUP


def client_of(group_dir: Path) -> Iterator[Any]:
    """The app's Flask test client on ``group_dir`` (a generator, for a fixture to ``yield from``)."""
    from comgra.server.app import create_app

    app = create_app(group_dir, warm_up=False)
    try:
        yield app.server.test_client()
    finally:
        app.server.config.clear()
