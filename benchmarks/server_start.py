"""How long ``comgra --path DIR`` takes from the command to the first page served, in a fresh process.

Writes a small synthetic recording (benchmarks/synthetic_recording.py, the one the CLI tests use),
then starts the app ``--rounds`` times as a user would (``python -m comgra.cli.app --path DIR --port 0``),
each time reading the address it prints and fetching the page, then stopping it with Ctrl+C. Prints
each round's seconds and the median, minimum and maximum, with the load average, since the figure is
mostly interpreter start and imports and moves with what else the machine does. The test of the same
start (tests/server/test_cli_app.py) checks behaviour only.

    python benchmarks/server_start.py --rounds 5
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_recording import Options, write_recording  # noqa: E402


def one_start(group: Path) -> float:
    """Seconds from starting the process to the first page answered with 200."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "comgra.cli.app", "--path", str(group), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            match = re.search(r"(http://[^\s?]+)", line)  # the address without ?token=: reads are open on loopback
            if match:
                with urllib.request.urlopen(match.group(1), timeout=60) as response:
                    assert response.status == 200
                return time.perf_counter() - start
        raise RuntimeError("the app printed no address")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        group = write_recording(Path(folder), Options(scale=0.05, steps_per_chunk=5))
        seconds = []
        for round_number in range(arguments.rounds):
            seconds.append(one_start(group))
            print(f"round {round_number + 1}: {seconds[-1]:.2f} s", flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"command to first page: median {statistics.median(seconds):.2f} s, min {min(seconds):.2f} s, "
          f"max {max(seconds):.2f} s over {len(seconds)} starts (load average {load:.1f}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
