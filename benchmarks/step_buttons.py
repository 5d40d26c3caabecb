"""The server's part of the next-step button, in one process (no browser, no HTTP, no findings scan).

For each recording (a group folder, e.g. one app_latency.py wrote under --out) it clicks the next-step
button ``--clicks`` times as the page asks it: the values route's answer (timed), then the button's
view callback and the hover cards (untimed), then a user's pause. Prints p50 / p95 ms of the values
route and of the hover cards. To compare with another version, run it again with
``PYTHONPATH=<that version's src>``.

    python benchmarks/step_buttons.py /tmp/g_bench/nodes-200-scale-50/synthetic --clicks 20
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from comgra.server.tensors import click_values
from comgra.server.view_state import next_wanted
from comgra.service import RecordingService


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    return f"{statistics.median(ordered):.1f} / {ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]:.1f}"


def walk(group: Path, clicks: int, pause: float) -> tuple[list[float], list[float]]:
    service = RecordingService(group)
    try:
        view = service.resolve({})
        store = {"wanted": {}, "shown": view.selection.to_dict()}
        route, cards = [], []
        for _ in range(clicks):
            time.sleep(pause)
            start = time.perf_counter()
            click_values(service, {"selection": store, "trigger": "step_next"})
            route.append((time.perf_counter() - start) * 1000)
            wanted, _ = next_wanted(service, store["wanted"], store["shown"], "step_next", {"step_next": None})
            selection = service.resolve(wanted).selection  # the button's view callback
            start = time.perf_counter()
            service.node_summaries(selection.trial, selection.training_step, selection.iteration,
                                   kind=selection.kind, rank=selection.rank)
            cards.append((time.perf_counter() - start) * 1000)
            store = {"wanted": wanted, "shown": selection.to_dict()}
        return route, cards
    finally:
        service.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", type=Path, nargs="+")
    parser.add_argument("--clicks", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between clicks, as a user looks")
    args = parser.parse_args(argv)
    print("| recording | next step: values route | hover cards after the step change |\n|---|---|---|")
    for group in args.groups:
        route, cards = walk(group, args.clicks, args.pause)
        print(f"| {group} | {percentiles(route)} | {percentiles(cards)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
