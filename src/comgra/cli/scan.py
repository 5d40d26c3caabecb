"""``comgra scan``: findings of a recording as a compact list (``--verbose``: the full text), or as JSON.

    comgra scan ROOT/GROUP [--trial T ...] [--json] [--verbose] [--sensitivity S] [--target NAME] [--detector M:F ...]
    comgra scan ROOT/GROUP --engine ray [--ray-address HOST:PORT]      # one Ray task per trial (docs/sweeps.md)

The list gives one line per finding (its rank, severity, node and step, and the message's first sentence, cut
to the terminal's width), grouped by trial, and ends with the command that opens the app on the first finding.
Nothing of a finding is read as Rich markup: a message that says ``x[i]`` prints ``x[i]``; and every control
character of recorded text (a trial's or a node's name, a message) is printed as a visible escape
(``comgra.terminal.printable``), never sent raw to the terminal.

Exit 0 with or without findings; 2 with a one-line message on a bad path, trial, target or
option, or a recording of a newer format.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shlex
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from comgra.cli.arguments import USAGE_ERROR, UsageError, add_path, check_recording, chosen_path, drop_recording_paths
from comgra.errors import ComgraError

log = logging.getLogger(__name__)

PROGRESS_AFTER_SECONDS = 1.0
PLAIN_EVERY_SECONDS = 10.0
DEFAULT_WIDTH = 100
ENGINES = ("local", "ray")
# By default a group of fewer trials is scanned in this process: starting a worker (importing the detectors'
# libraries) costs about as much CPU as scanning a few small trials.
POOL_FROM_TRIALS = 8
SEVERITY_STYLES = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="comgra scan", description="Find anomalies in a recording and say where "
                                     "they start: non-finite values, vanishing gradients, dead units, ...")
    add_path(result, "the group folder: comgra_root_path/group, or its URL (s3://bucket/runs/group, ...)")
    result.add_argument("--engine", choices=ENGINES, default="local",
                        help="local: this process (default); ray: one Ray task per trial on the cluster of "
                             "--ray-address or RAY_ADDRESS (a local Ray when neither)")
    result.add_argument("--ray-address", help="the Ray cluster to scan on (default: RAY_ADDRESS)")
    result.add_argument("--workers", type=_workers, default=0,
                        help="local: scan in this many processes (default: one per usable core from 8 trials on; "
                             "1: in this process; detectors of --detector or comgra.toml scan in this process)")
    result.add_argument("--trial", action="append", help="scan only this trial (repeatable; default: all)")
    result.add_argument("--json", action="store_true", help="print the findings as JSON (format_version 1)")
    result.add_argument("--verbose", "-v", action="store_true",
                        help="print each finding's full text and its link, not one line per finding")
    result.add_argument("--detector", action="append", metavar="MODULE:FUNCTION",
                        help="also run this detector of your own (repeatable; see comgra.analysis.custom)")
    result.add_argument("--sensitivity", type=_sensitivity, default=None,
                        help="above 1 finds more, below 1 fewer (default: [anomalies] sensitivity of comgra.toml, "
                             "else 1)")
    result.add_argument("--config", type=Path,
                        help="a comgra.toml file (default: comgra.toml in the working directory, if there is one)")
    result.add_argument("--target", help="the per-sample tensor that correlation hints explain "
                                         "(default: a loss-like one such as loss_per_sample)")
    return result


def run(arguments: list[str]) -> int:
    """Parse, scan, print; a bad argument raises ``UsageError`` (one line, exit 2)."""
    args = parser().parse_args(arguments)  # before the heavy imports: a usage error answers at once
    path = chosen_path(args)
    assert path is not None  # required
    group = check_recording(path)
    from comgra.analysis import ScanOptions, Scanner, document
    from comgra.service import finding_link

    options = ScanOptions(sensitivity=_chosen_sensitivity(args), target=args.target)
    own_detectors = _load_user_detectors(args)
    try:
        with _Progress() as progress:
            if args.engine == "ray":
                result = _scan_on_ray(group, args, options, progress.update)
            elif isinstance(group, Path) and not own_detectors and _pool_size(group, args) > 1:
                result = _scan_in_processes(group, args, options, progress.update)
            else:
                result = Scanner(persist=True, keep_chunks=False).scan(group, trials=args.trial, options=options,
                                                                       on_trial=progress.update)
    except ComgraError as error:
        raise UsageError(str(error).splitlines()[0]) from None
    _keep_runs_rows(group, len(result.trials))
    if args.json:
        print(json.dumps(document(result.findings, result.problems, link=finding_link), indent=1))
    else:
        console = _console()
        print_findings(console, result.findings, result.problems, result.trials, verbose=args.verbose,
                       link=finding_link, path=str(path))
    return 0


def _keep_runs_rows(group: Path | str, trials: int) -> None:
    """After a scan of a local sweep, its Runs rows computed and kept in the group (``service.runs_summary``), so
    that the first app over it reads one file instead of every trial at the click (about 0.5 CPU-s at 1,000 trials
    here, beside the scan's minutes). Nothing is raised: the app computes what is not kept."""
    if not isinstance(group, Path) or trials < 2:
        return
    from comgra.service import RecordingService

    service = RecordingService(group)
    try:
        service.runs()
    except Exception as error:  # noqa: BLE001 - a cache; the scan's answer stands
        log.debug("comgra scan: the Runs rows of %s are not kept (%s)", group, error)
    finally:
        service.close()


def _scan_on_ray(group: Path | str, args: argparse.Namespace, options: Any, on_trial: Callable[[str, int, int], None]) -> Any:
    """The scan as one Ray task per trial (``comgra.analysis.sweep.scan_on_ray``)."""
    from comgra.analysis import ScanResult
    from comgra.analysis.sweep import gathered, scan_on_ray

    try:
        import ray  # noqa: F401
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'comgra[ray]'") from None
    # Ray prints its own news (a task retried after its worker died, ...) on stdout: it goes to stderr here, so
    # that stdout holds the findings alone (``--json`` stays one document).
    with contextlib.redirect_stdout(sys.stderr):
        findings, problems, trials = gathered(scan_on_ray(group, trials=args.trial, options=options,
                                                          address=args.ray_address, on_trial=on_trial))
    return ScanResult(findings, problems, trials)


def _pool_size(group: Path, args: argparse.Namespace) -> int:
    """How many processes scan locally: ``--workers``, else one per usable core, never more than the trials."""
    from comgra.analysis.sweep import usable_cores

    trials = len(args.trial) if args.trial else sum(1 for _ in (group / "trials").iterdir())
    if not args.workers and trials < POOL_FROM_TRIALS:
        return 1
    return min(args.workers or usable_cores(), trials)


def _scan_in_processes(group: Path, args: argparse.Namespace, options: Any,
                       on_trial: Callable[[str, int, int], None]) -> Any:
    """The local scan in a pool of processes (``comgra.analysis.sweep.scan_in_processes``)."""
    from comgra.analysis import ScanResult
    from comgra.analysis.sweep import gathered, scan_in_processes

    findings, problems, trials = gathered(scan_in_processes(group, trials=args.trial, options=options,
                                                            workers=_pool_size(group, args), on_trial=on_trial))
    return ScanResult(findings, problems, trials)


def _load_user_detectors(args: argparse.Namespace) -> bool:
    """The user detectors of ``--detector`` and of comgra.toml's ``[anomalies] detectors``, registered; whether
    there were any (they are registered in this process only)."""
    from comgra.analysis.custom import load_configured
    from comgra.config import load_settings

    try:
        settings = load_settings(args.config)
        _say_ignored(settings)
        load_configured(settings.anomalies.detectors, explicit=args.detector or [])
    except ComgraError as error:
        raise UsageError(str(error)) from None
    return bool(settings.anomalies.detectors or args.detector)


def _say_ignored(settings: Any) -> None:
    if settings.ignored:
        print(f"comgra: not reading {settings.ignored!r}: it lies inside a recording, and a recording's files are "
              "data, not your settings (pass --config to read it anyway)", file=sys.stderr)


def _chosen_sensitivity(args: argparse.Namespace) -> float:
    """--sensitivity wins; else ``[anomalies] sensitivity`` of comgra.toml; else 1."""
    if args.sensitivity is not None:
        return float(args.sensitivity)
    from comgra.config import load_settings
    from comgra.service.findings import scan_options

    try:
        settings = load_settings(args.config)
        return scan_options(settings.anomalies.sensitivity,
                            source=f"{settings.source}: anomalies.sensitivity").sensitivity
    except ComgraError as error:
        raise UsageError(str(error)) from None


def _workers(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of worker processes; use 1 to 1024, e.g. 2")
    return int(text)


def _sensitivity(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a sensitivity; use a number above 0, e.g. 0.5 or 2")
    return value


class _Progress:
    """How far a scan is, in trials, on stderr once it has taken more than a second: a Rich progress bar on a
    terminal, elsewhere (a log, CI) a plain line at most every ``PLAIN_EVERY_SECONDS``. Thread-safe: trials
    are scanned side by side, and two of them could otherwise each start a bar. One bar for the whole scan,
    not one per trial: a sweep has thousands."""

    def __init__(self, terminal: bool | None = None) -> None:
        self._start = time.perf_counter()
        self._terminal = sys.stderr.isatty() if terminal is None else terminal
        self._bar: Any = None
        self._task: Any = None
        self._printed = 0.0  # when the last plain line was printed (0: none yet)
        self._last: tuple[int, int] | None = None
        self._shown: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self._printed and self._last is not None and self._last != self._shown and exc_info[0] is None:
            self._line(*self._last)

    def update(self, trial: str, done: int, total: int) -> None:
        """``done`` of ``total`` trials are scanned, ``trial`` the last of them."""
        with self._lock:
            self._last = (done, total)
            elapsed = time.perf_counter() - self._start
            if elapsed < PROGRESS_AFTER_SECONDS:
                return
            if self._terminal:
                self._update_bar(done, total)
            elif not self._printed or time.perf_counter() - self._printed >= PLAIN_EVERY_SECONDS or done == total:
                self._line(done, total)

    def _update_bar(self, done: int, total: int) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("scanning trials"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("scan", total=total)
        self._bar.update(self._task, completed=done, total=total)

    def _line(self, done: int, total: int) -> None:
        self._printed = time.perf_counter()
        self._shown = (done, total)
        print(f"comgra scan: {done}/{total} trials scanned ({self._printed - self._start:.0f} s)", file=sys.stderr,
              flush=True)


def _console() -> Any:
    from rich.console import Console

    # Not a terminal (a pipe, a file): as wide as $COLUMNS says, else 100 columns.
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "") or 0) or DEFAULT_WIDTH
    return Console(width=width, highlight=False, markup=False, emoji=False)


def print_findings(console: Any, findings: list[Any], problems: list[str], trials: list[str], *, verbose: bool,
                   link: Callable[[Any], str], path: str) -> None:
    """The findings on ``console``: one line each (``verbose``: the full text and the link), grouped by trial
    in the order of their most important finding, numbered by rank overall; then the next command."""
    from rich.text import Text as RichText

    from comgra.terminal import printable

    def Text(text: str = "", **style: Any) -> Any:  # noqa: N802 - rich.text.Text, with recorded text made printable
        return RichText(printable(text, lines=True), **style)

    if not findings:
        console.print(Text(f"No findings in {len(trials)} trial(s)."))
    else:
        console.print(Text(f"{len(findings)} finding(s) in {len({f.trial for f in findings})} of {len(trials)} trial(s), "
                           "most important first" + ("" if verbose else " (--verbose: the full text)") + ":"))
        wide = min(28, max(len(_where(f)) for f in findings))
        by_trial: dict[str, list[tuple[int, Any]]] = {}
        for number, finding in enumerate(findings, 1):
            by_trial.setdefault(finding.trial, []).append((number, finding))
        for trial, numbered in by_trial.items():
            console.print(Text(f"{trial}:", style="bold"))
            for number, finding in numbered:
                line = RichText.assemble(f"{number:>3} ", (printable(f"{finding.severity:<8}"),
                                                           SEVERITY_STYLES.get(finding.severity, "")),
                                         f"{column(printable(_where(finding)), wide)}  ",
                                         "" if verbose else printable(summary(finding)))
                if verbose:
                    line.rstrip()  # in place: the padding of the node column
                console.print(line, no_wrap=True, overflow="ellipsis")
                if verbose:
                    console.print(Text(textwrap.fill(" ".join(finding.message.split()), max(40, console.width - 1),
                                                     initial_indent=" " * 12, subsequent_indent=" " * 12)),
                                  soft_wrap=True)
                    console.print(Text(f"{' ' * 12}{finding.detector} · {link(finding)}", style="dim"), soft_wrap=True)
            if all(finding.severity == "info" for _, finding in numbered):  # where nothing is wrong, it says so
                console.print(Text("    no warnings or errors: the infos above are hints, not problems", style="green"))
        for trial in trials:  # a trial without findings is the point of a comparison (the fixed one): named
            if trial not in by_trial:
                console.print(RichText.assemble((printable(f"{trial}:"), "bold"), (" no findings", "green")))
    for problem in problems:
        console.print(Text(problem, style="yellow"))
    if findings:
        console.print(Text("Next, to open the app on finding 1: " + open_command(path, link(findings[0])), style="bold"),
                      soft_wrap=True)


def column(text: str, wide: int) -> str:
    """``text`` padded to ``wide`` characters, or cut in its middle with an ellipsis (both ends tell nodes apart), so
    that the column after it starts at the same place on every line, whatever the length of a node's name."""
    if len(text) <= wide:
        return text.ljust(wide)
    head = (wide - 1) // 2
    return f"{text[:head]}…{text[len(text) - (wide - 1 - head):]}"


def _where(finding: Any) -> str:
    return finding.node + ("" if finding.training_step is None else f" @ step {finding.training_step}")


def summary(finding: Any) -> str:
    """The first sentence of the message, without the node's name that the line shows already."""
    text = first_sentence(finding.message)
    if text.startswith(finding.node + " "):
        text = re.sub(r"^\([^()]*\) ", "", text[len(finding.node) + 1:])
    return text


def first_sentence(message: str) -> str:
    """The message up to its first sentence's end (". " followed by a capital or a digit), on one line."""
    flat = " ".join(message.split())
    match = re.search(r"\. (?=[A-Z0-9(])", flat)
    return flat[:match.start() + 1] if match else flat


def open_command(path: str, view: str) -> str:
    """The shell command that serves the recording and prints the address of ``view``."""
    return f"comgra {shlex.quote(path)} --view {shlex.quote(view)}"


def main(arguments: list[str]) -> int:
    """``comgra scan ...`` on its own (``python -m comgra.cli.scan``): ``run`` with the CLI's one-line errors."""
    drop_recording_paths()
    try:
        return run(arguments)
    except UsageError as error:
        from comgra.terminal import printable

        print(f"comgra: error: {printable(error)}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":  # pragma: no cover
    from comgra import terminal

    terminal.install()
    sys.exit(main(sys.argv[1:]))
