"""Training processes for the live tests: start train_script.py (alone or under torchrun), wait, finish.

    process, trial_dir, out = start_training(tmp_path, "--breakpoint", "loss", "step == 3")
    (out / "go").touch()
    state = wait_until(lambda: paused(trial_dir), process, "the breakpoint")

Every process started here is in ``STARTED`` until ``stop_all()`` (an autouse fixture of each test
module calls it), so that a failed test never leaves a training process paused forever.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from comgra.breakpoints import control

SCRIPT = Path(__file__).resolve().parent / "train_script.py"
STEPS = 12
STARTED: list[subprocess.Popen[str]] = []


def environment() -> dict[str, str]:
    """This process's environment without a torchrun's variables (a test may run under one)."""
    variables = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        variables.pop(name, None)
    return variables


def start_training(directory: Path, *extra: str, ranks: int = 1,
                   steps: int = STEPS) -> tuple[subprocess.Popen[str], Path, Path]:
    """train_script.py recording into directory/root, writing its losses to directory/out; it waits for out/go."""
    root, out = directory / "root", directory / "out"
    out.mkdir(parents=True, exist_ok=True)
    launcher = [sys.executable] if ranks == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    process = subprocess.Popen([*launcher, str(SCRIPT), str(root), str(out), str(steps), "--go", str(out / "go"),
                                *extra], env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # its own process group: torchrun's workers die with it
    STARTED.append(process)
    return process, root / "group" / "trials" / "trial", out


def stop(process: subprocess.Popen[str]) -> None:
    """Kill the process and its children (torchrun's workers would otherwise stay paused, holding its pipes)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


def stop_all() -> None:
    while STARTED:
        stop(STARTED.pop())


def wait_until(condition: Callable[[], Any], process: subprocess.Popen[str], what: str, timeout: float = 90.0) -> Any:
    """Poll ``condition`` until it is truthy; fail with the process's stderr if it ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process.poll() is not None and not condition():
            _, errors = process.communicate()
            raise AssertionError(f"training ended (rc {process.returncode}) while waiting for {what}: {errors[-3000:]}")
        time.sleep(0.05)
    stop(process)
    raise AssertionError(f"timed out waiting for {what}")


def paused(trial_dir: Path) -> dict[str, Any] | None:
    state = control.run_state(trial_dir)
    return state if state["state"] == "paused" else None


def finish(process: subprocess.Popen[str]) -> None:
    _, errors = process.communicate(timeout=120)
    assert process.returncode == 0, errors[-3000:]


def losses(out: Path, rank: int = 0) -> list[float]:
    return json.loads((out / f"losses-r{rank:03d}.json").read_text())
