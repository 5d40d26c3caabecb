"""``comgra demo``: serve the app at once on the tutorial's recording while a child process records it.

The port is bound before anything is recorded (a busy port fails in a second, with nothing recorded); the
app opens on the empty group and fills in as the recording's chunks land (its live reload); the child
prints the progress (a bar with an estimate on a terminal, a line every few seconds elsewhere). Whatever
stops the demo (the recording failing, Ctrl+C) ends with where the recording is and the command that
opens it.

    python -m comgra.cli.demo ROOT STEPS DIFFERENCE   # the child: records the tutorial into ROOT/demo
"""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

DEMO_GROUP = "demo"


def record_in_child(root: Path, steps: int, difference: int) -> subprocess.Popen[bytes]:
    """Start recording the tutorial into ``root / DEMO_GROUP`` in a child process (its stderr is ours)."""
    return subprocess.Popen([sys.executable, "-m", "comgra.cli.demo", str(root), str(steps), str(difference)],
                            stdin=subprocess.DEVNULL)


def reopen_hint(group: Path) -> str:
    return f"the recording is in {group}; open it with: comgra {group}"


def watch_child(child: subprocess.Popen[bytes], group: Path, done: threading.Event) -> threading.Thread:
    """A thread that waits for the child and says how the recording ended (the app keeps serving)."""
    def wait() -> None:
        code = child.wait()
        if code == 0:
            print(f"comgra: recording done; {reopen_hint(group)}", file=sys.stderr, flush=True)
        elif not done.is_set():  # not our own Ctrl+C
            print(f"comgra: the recording stopped with exit code {code} (its error is above); the app shows what "
                  f"was recorded; {reopen_hint(group)}", file=sys.stderr, flush=True)
    thread = threading.Thread(target=wait, name="comgra-demo-child", daemon=True)
    thread.start()
    return thread


def stop_child(child: subprocess.Popen[bytes], done: threading.Event) -> None:
    done.set()
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _child(arguments: list[str]) -> int:
    root, steps, difference = Path(arguments[0]), int(arguments[1]), int(arguments[2])
    from comgra.examples.tutorial import run_tutorial

    try:
        # profile=True: the Profile tab shows the layers' flame graph (benchmarks/demo_profile_cost.py: its cost)
        run_tutorial(root, DEMO_GROUP, steps=steps, min_training_steps_difference=difference, progress=True,
                     profile=True)
    except KeyboardInterrupt:
        return 130
    return 0


def main_child(argv: Any = None) -> None:
    sys.exit(_child(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main_child()
