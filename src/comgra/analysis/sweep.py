"""The scan of a sweep as a map over its trials: one process, or one task per trial on Ray, Dask or Spark.

``scan_trial(group, trial)`` is the unit of work: it reads one trial from the group, runs every detector, and
writes what it found beside the recording (the signed JSON the app and ``comgra scan`` read, and the trial's file
of the findings table, ``comgra.analysis.findings_table``), each write atomic and replacing the previous one. So a
task that is retried after its worker was lost, or a trial scanned twice, never doubles anything, and a trial
whose saved findings are current is answered from them without scanning. It holds nothing once it returns.

Any engine that can map a function over a list maps it over ``trial_ids(group)``::

    import dask.bag as db
    from comgra.analysis.sweep import scan_trial, trial_ids

    scans = db.from_sequence(trial_ids(group), npartitions=8).map(lambda t: scan_trial(group, t)).compute()

``scan_on_ray`` does this with one Ray task per trial (``comgra scan GROUP --engine ray``); a task whose worker
or node is lost is retried by Ray (``max_retries``). ``scan_in_processes`` does it in a pool of this machine's
cores (``comgra scan GROUP``, the default for a group of several trials).
"""
from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comgra.analysis.findings import Finding, ScanOptions, rank_findings
from comgra.errors import ComgraError, SelectionError, did_you_mean

TASK_RETRIES = 4  # a task whose worker or node died is run again this many times at most


@dataclass
class TrialScan:
    """What ``scan_trial`` found in one trial: its findings (most useful first) and what it had to skip."""

    trial: str
    findings: list[Finding] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Findings per severity, e.g. ``{"error": 1, "warning": 2, "info": 0}``."""
        from comgra.analysis.findings import SEVERITIES

        return {severity: sum(f.severity == severity for f in self.findings) for severity in SEVERITIES}


def trial_ids(group: str | Path) -> list[str]:
    """The trials of a group folder, sorted: what an engine maps ``scan_trial`` over."""
    from comgra.store.reader import GroupReader

    return GroupReader(group).trials()


def scan_trial(group: str | Path, trial: str, *, options: ScanOptions | None = None) -> TrialScan:
    """Scan one trial of ``group`` and save its findings beside the recording (idempotent; see the module).

    A trial that cannot be read is answered with a problem, not an exception: one bad trial of a thousand does
    not fail the map.

        >>> scan_trial("runs/sweep", "lr_0.01").counts()          # doctest: +SKIP
        {'error': 0, 'warning': 2, 'info': 5}
    """
    from comgra.analysis.scan import Scanner
    from comgra.store.reader import GroupReader

    reader = GroupReader(group)
    try:
        found, problems = Scanner(persist=True, keep_chunks=False).scan_and_release(reader, trial,
                                                                                    options or ScanOptions())
    except ComgraError as error:
        return TrialScan(trial, [], [f"trial {trial!r}: {error}"])
    finally:
        reader.close()
        _collect_now_and_then()
    return TrialScan(trial, rank_findings(found), list(problems))


_scanned = itertools.count(1)


def _collect_now_and_then() -> None:
    """A full garbage collection every ``COLLECT_EVERY_TRIALS`` trials this process scanned with ``scan_trial``: each
    call makes a ``Scanner`` of its own, whose count of trials starts again, so a long-lived worker of a pool, Ray or
    Dask would otherwise free what only reference cycles hold when Python's own thresholds say so."""
    from comgra.analysis.loading import return_freed_memory
    from comgra.analysis.scan import COLLECT_EVERY_TRIALS

    if next(_scanned) % COLLECT_EVERY_TRIALS == 0:
        return_freed_memory(collect=True)


def _scan_task(group: str, trial: str, options: ScanOptions) -> TrialScan:
    return scan_trial(group, trial, options=options)


def scan_on_ray(group: str | Path, *, trials: list[str] | None = None, options: ScanOptions | None = None,
                address: str | None = None, on_trial: Callable[[str, int, int], None] | None = None,
                max_retries: int = TASK_RETRIES) -> Iterator[TrialScan]:
    """Scan the trials of ``group`` on a Ray cluster, one task per trial, yielding each trial's answer as it
    comes (in no set order). ``address``: the cluster (default: ``RAY_ADDRESS``; neither: a local Ray started
    here). Every node must see ``group`` at the same path (a shared file system) and have comgra installed."""
    import ray

    wanted = _checked_trials(group, trials)
    options = options or ScanOptions()
    address = address or os.environ.get("RAY_ADDRESS") or None
    started_here = not ray.is_initialized()
    if started_here:
        with _workers_at_our_priority(local=address is None):
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=False)(_scan_task)
        path = str(Path(group).expanduser().resolve()) if "://" not in str(group) else str(group)
        pending = {task.remote(path, trial, options): trial for trial in wanted}
        done = 0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for reference in ready:
                pending.pop(reference)
                answer: TrialScan = ray.get(reference)
                done += 1
                if on_trial is not None:
                    on_trial(answer.trial, done, len(wanted))
                yield answer
    finally:
        if started_here:
            ray.shutdown()


@contextlib.contextmanager
def _workers_at_our_priority(*, local: bool) -> Iterator[None]:
    """A local Ray started here runs its task workers at this process's priority: Ray's default (``worker_niceness``
    15) suits a node that runs nothing else, but on a shared machine it left the scan a fraction of the cores it
    asked for (a scan of 1,000 trials at 0.5 trials/s beside a load of 17, where the process pool did 1.2). A
    user's own ``RAY_worker_niceness`` wins; the setting is read when Ray starts, and not left in the environment."""
    if not local or "RAY_worker_niceness" in os.environ:
        yield
        return
    os.environ["RAY_worker_niceness"] = "0"
    try:
        yield
    finally:
        os.environ.pop("RAY_worker_niceness", None)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def scan_in_processes(group: str | Path, *, trials: list[str] | None = None, options: ScanOptions | None = None,
                      workers: int | None = None,
                      on_trial: Callable[[str, int, int], None] | None = None) -> Iterator[TrialScan]:
    """Scan the trials of a local ``group`` in a pool of ``workers`` processes (default: ``usable_cores()``), one
    ``scan_trial`` per trial, yielding each trial's answer as it comes (in no set order). The detectors are pure
    Python and NumPy/pandas that hold the GIL, so threads scanned about one trial at a time; processes use every
    core. Each worker lets go of a trial once its findings are saved (``scan_trial``), so the memory of each
    process stays flat in the number of trials. Detectors of your own (``comgra.analysis.custom``) are registered
    in this process only: scan with them in-process (``Scanner``)."""
    import concurrent.futures
    import multiprocessing

    wanted = _checked_trials(group, trials)
    options = options or ScanOptions()
    count = max(1, min(len(wanted), workers or usable_cores()))
    # spawn: fresh workers (a fork would copy this process's threads in whatever state they hold), children of
    # this process, so that its peak RSS and CPU time, as its parent sees them (wait4), include theirs.
    context = multiprocessing.get_context("spawn")
    path = str(Path(group).expanduser().resolve())
    pool = concurrent.futures.ProcessPoolExecutor(count, mp_context=context)
    try:
        futures = [pool.submit(_scan_task, path, trial, options) for trial in wanted]
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            try:
                answer: TrialScan = future.result()
            except concurrent.futures.process.BrokenProcessPool:
                raise ComgraError(f"A scan worker process died (out of memory, or killed) after {done - 1} of "
                                  f"{len(wanted)} trials; what was scanned is saved. Scan again with fewer "
                                  "--workers (1: in this process).") from None
            if on_trial is not None:
                on_trial(answer.trial, done, len(wanted))
            yield answer
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _checked_trials(group: str | Path, trials: list[str] | None) -> list[str]:
    known = trial_ids(group)
    for trial in trials or []:
        if trial not in known:
            raise SelectionError(f"No trial {trial!r} in {str(group)!r}" + did_you_mean(trial, known))
    return list(known if trials is None else trials)


def gathered(scans: Iterator[TrialScan] | list[TrialScan]) -> tuple[list[Finding], list[str], list[str]]:
    """Findings (ranked over every trial), problems and trials of a map's answers."""
    answers: list[Any] = sorted(scans, key=lambda s: s.trial)
    findings = rank_findings([f for s in answers for f in s.findings])
    return findings, [p for s in answers for p in s.problems], [s.trial for s in answers]
