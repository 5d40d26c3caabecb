"""The findings questions of the service (issue 8): findings per trial, badges for the graph, links.

Each service owns one background scanner (``FindingsWorker``): a
thread (``MAX_SCAN_THREADS``) that takes trials from one queue and scan each trial once per data version (the set of
its chunks). The Findings tab, the graph badges and the REST API all read what it found; none of
them scans on its own. A scan reads each chunk once (chunks are immutable), so a live run's new
steps cost only their own chunks. What it finds is saved in the recording (``comgra.analysis.saved``),
and a trial whose saved findings match its data is answered from there at once, without loading the
detectors: a recording that was ever scanned opens its Findings tab complete.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from comgra.analysis import saved
from comgra.analysis.findings import Finding, ScanOptions, rank_findings, trial_signature
from comgra.errors import ComgraError, ConfigError
from comgra.service.selection import view_link

if TYPE_CHECKING:
    from comgra.analysis.scan import Scanner
    from comgra.store.reader import GroupReader

log = logging.getLogger("comgra.service")
BADGE_SEVERITIES = ("error", "warning")
BADGE_MARK = "\u26a0"  # ⚠
# One thread: the app's own requests keep the other core on a 2-core machine (comgra scan, which has
# nothing else to do, scans trials side by side).
MAX_SCAN_THREADS = 1
# The scanner starts no trial while the app answers a person (a request, the warm-up): it waits until none has been
# answered for QUIET_SECONDS, at most WAIT_AT_MOST_SECONDS per trial (so that a busy app still gets its findings).
# Its work holds the GIL: the Runs rows of 1,000 trials asked on a fresh app took twice their CPU time beside it.
QUIET_SECONDS = 0.25
WAIT_AT_MOST_SECONDS = 2.0
# The detectors' libraries, imported by the scanner before its first trial a part at a time, each when the app is quiet:
# whole, they took 1.5-2.5 s of the GIL in one piece (scipy.stats most of it), whatever the app was answering then.
LIBRARIES = ("scipy.linalg", "scipy.sparse", "scipy.special", "scipy.optimize", "scipy.spatial", "scipy.integrate",
             "scipy.stats", "sklearn.utils", "sklearn.tree", "sklearn.ensemble", "comgra.analysis.detectors")


def finding_link(finding: Finding) -> str:
    """The app's link that opens the selection showing a finding (built with ``view_link``)."""

    kind = finding.evidence.get("type_of_execution")  # where an evaluation shares a training step's number
    return view_link(finding.trial, type_of_execution=kind if isinstance(kind, str) else None,
                     training_step=finding.training_step, iteration=finding.iteration,
                     node_id=finding.node, role=finding.role, kind=finding.kind, aggregation=finding.aggregation,
                     statistic=finding.statistic)


def scan_options(sensitivity: float | None = None, *, source: str = "sensitivity") -> ScanOptions:
    """The default scan options at ``sensitivity`` (None: the built-in default); 0 or less is refused."""
    if sensitivity is None:
        return ScanOptions()
    if not sensitivity > 0:
        raise ConfigError(f"{source}={sensitivity!r}: a sensitivity must be above 0, e.g. 0.5 (fewer findings), "
                          "1 (the default) or 2 (more).")
    return ScanOptions(sensitivity=float(sensitivity))


class Foreground:
    """The answers being computed now for a person, which the background scanner makes way for. Thread-safe."""

    def __init__(self) -> None:
        self._answering = 0
        self._last = float("-inf")  # time.monotonic() when the last answer was done
        self._changed = threading.Condition()
        self._local = threading.local()  # how deep this thread is in ``answering``

    @contextmanager
    def answering(self) -> Iterator[None]:
        self._enter()
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1
            self._leave()

    @contextmanager
    def aside(self) -> Iterator[None]:
        """Within an answer, while it waits for the scan itself (``FindingsWorker.wait``): the scan goes on."""
        inside = getattr(self._local, "depth", 0) > 0
        if inside:
            self._leave()
        try:
            yield
        finally:
            if inside:
                self._enter()

    def _enter(self) -> None:
        with self._changed:
            self._answering += 1

    def _leave(self) -> None:
        with self._changed:
            self._answering -= 1
            self._last = time.monotonic()
            self._changed.notify_all()

    def wait_quiet(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Return once nothing has been answered for ``QUIET_SECONDS``, after ``WAIT_AT_MOST_SECONDS``, or once
        ``stop()`` (checked whenever ``wake`` is called)."""
        quiet, at_most = QUIET_SECONDS, WAIT_AT_MOST_SECONDS
        started = time.monotonic()
        with self._changed:
            while not stop():
                now = time.monotonic()
                left = started + at_most - now
                calm = self._last + quiet - now if self._answering == 0 else left
                if left <= 0 or calm <= 0:
                    break
                self._changed.wait(min(calm, left))

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()


@dataclass(frozen=True)
class FindingsProgress:
    """What the background scanner has found so far: ``pending`` trials are still being scanned."""

    findings: list[Finding]
    pending: list[str]
    problems: list[str]
    version: int  # ``findings_version()`` when this was taken
    background: bool = True  # False: nothing is scanned in this process (only saved findings are shown)


class FindingsWorker:
    """The one background scanner of a service. Thread-safe.

    ``request`` queues the trials whose data changed since their last scan (most recently asked
    first) and returns at once; up to ``MAX_SCAN_THREADS`` threads work through the queue and end
    when it is empty. ``version`` counts the scans finished, so that a view knows when to redraw.
    """

    def __init__(self, group: GroupReader, options: ScanOptions, *, background: bool = True,
                 foreground: Foreground | None = None, in_child: bool = False) -> None:
        self.group = group
        self.options = options
        self.foreground = foreground or Foreground()  # the app's requests, which the scan makes way for
        # False (``comgra --no-findings-scan``): nothing is scanned here; findings saved by ``comgra scan`` are shown.
        self.background = background
        # ``in_child`` (``comgra``'s own server): each scan runs in a child process (service/scan_process.py), where a
        # local group's detectors can all be imported by name; otherwise here.
        self._process = _scan_process(group) if in_child and background else None
        self._scanner: Scanner | None = None
        self._scanner_lock = threading.Lock()  # not ``_changed``: importing the scanner takes seconds
        self._own_group: GroupReader | None = None
        self._done: dict[str, tuple[tuple[str, ...], list[Finding], list[str]]] = {}  # trial -> signature, ...
        self._versions: dict[str, int] = {}
        self._queue: list[str] = []
        self._running: set[str] = set()
        self._threads = 0
        self._version = 0
        self._closed = False
        self._changed = threading.Condition()

    @property
    def scanner(self) -> Scanner:
        with self._scanner_lock:
            if self._scanner is None:
                from comgra.analysis.scan import Scanner  # pandas, scipy: seconds to import, not at app start

                self._scanner = Scanner(persist=True)
            return self._scanner

    def version(self, trial_id: str | None = None) -> int:
        with self._changed:
            return self._version if trial_id is None else self._versions.get(trial_id, 0)

    def request(self, trials: list[str]) -> list[str]:
        """Queue the trials not scanned at their current data (the first ones first); returns them.
        A trial whose findings at its current data are saved in the recording is taken from there at
        once (milliseconds, without loading the detectors) instead of being queued."""
        with self._changed:  # waiting or being scanned: stale without a look (the app polls this every second)
            pending = {*self._queue, *self._running}
        stale = [t for t in trials if t in pending or self._stale(t)]
        if not self.background:
            return []  # nothing will be scanned, so nothing is pending
        with self._changed:
            if self._closed:
                return stale
            # The stale ones first (in their order), then the rest: one pass, not a search of the queue per trial
            # (the app asks this of every trial every second; 1,000 queued trials made that a million steps).
            first = set(stale)
            self._queue = [*dict.fromkeys(t for t in stale if t not in self._running),
                           *(t for t in self._queue if t not in first)]
            wanted = min(MAX_SCAN_THREADS, os.cpu_count() or 1, len(self._queue)) - self._threads
            for _ in range(max(0, wanted)):
                self._threads += 1
                # Not a daemon: a daemon thread inside DuckDB when the interpreter ends aborts the process
                # ("terminate called ..."); this one stops after its trial once the main thread has ended.
                threading.Thread(target=self._work, name="comgra-findings").start()
        return stale

    def wait(self, trials: list[str], timeout: float | None = None) -> bool:
        """Wait until ``trials`` are scanned at their current data; False if ``timeout`` came first."""
        with self.foreground.aside():
            return self._wait(trials, timeout)

    def _wait(self, trials: list[str], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            stale = self.request(trials)
            if not stale:
                return True
            with self._changed:
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or self._closed:
                    return False
                if not self._queue and not self._running and not self._threads:
                    return False  # nothing can scan them (the app is stopping)
                self._changed.wait(left if left is None else min(left, 1.0))

    def progress(self, trials: list[str]) -> FindingsProgress:
        """What is found so far for ``trials`` (at their last scan), without waiting; queues stale ones."""
        pending = self.request(trials)
        with self._changed:
            done = [self._done[t] for t in trials if t in self._done]
            version = self._version
        return FindingsProgress(rank_findings([f for _, found, _ in done for f in found]), pending,
                                [p for _, _, problems in done for p in problems], version, self.background)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._queue.clear()
            self._changed.notify_all()
        self.foreground.wake()
        if self._process is not None:
            self._process.close()

    def _stale(self, trial_id: str) -> bool:
        """Whether the trial's data changed since its last answer, and no saved findings of it are current (the
        trial's signature, a listing of its chunks, taken once for both)."""
        signature = self._signature(trial_id)
        return not self._is_current(trial_id, signature) and not self._take_saved(trial_id, signature)

    def _is_current(self, trial_id: str, signature: tuple[str, ...]) -> bool:
        with self._changed:
            return trial_id in self._done and self._done[trial_id][0] == signature

    def _take_saved(self, trial_id: str, signature: tuple[str, ...]) -> bool:
        """Take the findings saved in the recording for the trial's current data (``signature``), if there are
        any. Saved findings of older data (a run that went on after the last scan) are shown until the trial's new
        scan is done, as a scan of this process would be."""
        try:
            kept = saved.read(self.group.trial(trial_id), self.options) if signature else None
        except ComgraError:
            return False
        if kept is None:
            return False
        with self._changed:
            if trial_id in self._running:
                return False  # being scanned: its answer comes from there
            if kept.signature == signature:
                self._finish(trial_id, signature, kept.findings, kept.problems)
                return True
            if trial_id not in self._done:
                self._done[trial_id] = (kept.signature, kept.findings, kept.problems)
                self._version += 1
                self._versions[trial_id] = self._versions.get(trial_id, 0) + 1
        return False

    def _finish(self, trial_id: str, signature: tuple[str, ...], found: list[Finding], problems: list[str]) -> None:
        """Record a trial's answer; the caller holds ``_changed``."""
        self._done[trial_id] = (signature, found, problems)
        self._running.discard(trial_id)
        if trial_id in self._queue:
            self._queue.remove(trial_id)
        self._version += 1
        self._versions[trial_id] = self._versions.get(trial_id, 0) + 1
        self._changed.notify_all()

    def _signature(self, trial_id: str) -> tuple[str, ...]:
        try:
            return trial_signature(self.group.trial(trial_id))
        except ComgraError:
            return ()  # an unknown or unreadable trial: scanned once, to an empty answer

    def _work(self) -> None:
        try:
            if self._process is None:  # a child scans: this process needs none of the detectors' libraries
                self._import_quietly()
            while True:
                self.foreground.wait_quiet(stop=lambda: self._closed)
                with self._changed:
                    if self._closed or not self._queue or not threading.main_thread().is_alive():
                        return
                    trial = self._queue.pop(0)
                    self._running.add(trial)
                self._scan(trial)
        finally:
            with self._changed:
                self._threads -= 1
                self._changed.notify_all()

    def _import_quietly(self) -> None:
        for name in LIBRARIES:
            if name in sys.modules:
                continue
            self.foreground.wait_quiet(stop=lambda: self._closed)
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the scan imports them again and reports what fails
                return

    @property
    def _scan_group(self) -> GroupReader:
        """The scanner's own reader of the group: the trials it opens are let go of once scanned, while those the
        app's views opened (``self.group``) stay open for them."""
        with self._scanner_lock:
            if self._own_group is None:
                from comgra.store.reader import GroupReader

                self._own_group = GroupReader(self.group.path)
            return self._own_group

    def _scan(self, trial_id: str) -> None:
        signature = self._signature(trial_id)
        with self._changed:
            # Scanned before at other data (a live run): its chunks are kept, so that the next scan reads only the
            # new ones. A trial scanned for the first time (most of a sweep) lets go of them at once.
            live = trial_id in self._done
        try:
            if self._process is not None:  # the child keeps what it read; nothing of the scan is held here
                found, problems = self._process.scan(trial_id, self.options)
            else:
                found, problems = self.scanner.scan_and_release(self._scan_group, trial_id, self.options)
                if not live:
                    self.scanner.forget(self._scan_group, trial_id, reader=False, chunks=True)
        except ComgraError as error:
            found, problems = [], [f"trial {trial_id!r}: {error}"]
        except Exception as error:  # noqa: BLE001 - a scanner fault must not stop the other trials
            log.exception("comgra: the findings of trial %r could not be computed", trial_id)
            found, problems = [], [f"trial {trial_id!r}: {type(error).__name__}: {error}"]
        with self._changed:
            self._finish(trial_id, signature, found, problems)
            idle = not self._queue and len(self._running) == 0
        if idle and self._process is None:
            # The findings are saved and kept above: the chunks the scan read are not needed until a live
            # run writes more (then read again), and they are most of what a scan leaves in memory.
            self.scanner.release()


class FindingQuestions:
    """Findings of the trials of one group folder, from one background scanner made on first use."""

    def __init__(self, group: GroupReader):
        self.group = group
        self.foreground = Foreground()  # what the app is answering now (``answering``), which the scan makes way for
        self._worker: FindingsWorker | None = None
        self._worker_lock = threading.Lock()

    def answering(self) -> Any:
        """A context in which the app answers a person: the background scanner starts no trial meanwhile."""
        return self.foreground.answering()

    def configure_findings(self, *, sensitivity: float | None = None, background: bool = True,
                           in_child: bool = False) -> None:
        """The default sensitivity of the findings (``[anomalies] sensitivity`` of comgra.toml); with
        ``background=False`` nothing is scanned in this process and only saved findings are shown; with
        ``in_child`` the background scans run in a child process (``comgra``'s own server)."""
        options = scan_options(sensitivity, source="[anomalies] sensitivity")
        with self._worker_lock:
            if self._worker is not None:
                self._worker.close()
            self._worker = FindingsWorker(self.group, options, background=background, foreground=self.foreground,
                                          in_child=in_child)

    @property
    def findings_options(self) -> ScanOptions:
        return self._findings_worker().options

    def _findings_worker(self) -> FindingsWorker:
        with self._worker_lock:
            if self._worker is None:
                self._worker = FindingsWorker(self.group, ScanOptions(), foreground=self.foreground)
            return self._worker

    def _trials_first(self, trial_id: str | None) -> list[str]:
        trials = self.group.trials()
        if trial_id is None:
            return trials
        return [trial_id] + [t for t in trials if t != trial_id]

    def findings(self, trial_id: str | None = None, options: ScanOptions | None = None) -> list[Finding]:
        """Findings of one trial or of all, most useful first (waits for the scan); trials that cannot
        be read are skipped. Other ``options`` than the service's are scanned here and now."""
        worker = self._findings_worker()
        trials = [trial_id] if trial_id is not None else self.group.trials()
        if options is not None and options != worker.options:
            return self._scanned_now(trials, options)
        worker.wait(trials)
        return worker.progress(trials).findings

    def findings_progress(self, trial_id: str | None = None, wait_seconds: float = 0.0) -> FindingsProgress:
        """What the background scanner has found so far; waits at most ``wait_seconds`` for the rest."""
        worker = self._findings_worker()
        trials = [trial_id] if trial_id is not None else self.group.trials()
        if wait_seconds > 0:
            worker.wait(trials, wait_seconds)
        return worker.progress(trials)

    def findings_version(self, trial_id: str | None = None) -> int:
        """A number that changes whenever a scan of the trial (default: of any trial) has finished: a
        view that shows findings or badges redraws when it changes. Queues trials whose data changed."""
        worker = self._findings_worker()
        worker.request(self._trials_first(trial_id))
        return worker.version(trial_id)

    def finding_badges(self, trial_id: str, wait_seconds: float = 0.0) -> dict[str, str]:
        """node id -> a short badge ("2 ⚠") for the nodes of a trial with findings of warning or above.

        Never waits for a scan unless asked to: the trial is queued (first) on the background
        scanner and the badges of its last scan are returned; ``findings_version(trial)`` changes
        when a newer scan is done (the app then asks again).
        """
        worker = self._findings_worker()
        trials = self._trials_first(trial_id)
        if wait_seconds > 0:
            worker.wait([trial_id], wait_seconds)
        worker.request(trials)  # the others after it: the Findings tab opens on a finished scan
        return badges_of(worker.progress([trial_id]).findings)

    def close_findings(self) -> None:
        """Stop the background scanner after the trials it is scanning (``RecordingService.close``)."""
        with self._worker_lock:
            worker = self._worker
        if worker is not None:
            worker.close()

    def finding_documents(self, trial_id: str | None = None) -> list[dict[str, Any]]:
        """The findings as JSON documents (the ``comgra scan --json`` form), each with its link."""
        return [f.to_json(finding_link(f)) for f in self.findings(trial_id)]

    def _scanned_now(self, trials: list[str], options: ScanOptions) -> list[Finding]:
        scanner = self._findings_worker().scanner
        found: list[Finding] = []
        for trial in trials:
            try:
                found.extend(scanner.scan_trial(self.group, trial, options)[0])
            except ComgraError:
                continue
        return rank_findings(found)


def _scan_process(group: GroupReader) -> Any:
    """A ``ScanProcess`` for a local group folder whose user detectors another process can import; else None."""
    from comgra.service.scan_process import ScanProcess, importable_detectors

    detectors = importable_detectors()
    if detectors is None or getattr(group, "mirror", None) is not None:  # a URL's mirror publishes from here
        return None
    return ScanProcess(str(group.path), detectors)


def badges_of(findings: list[Finding]) -> dict[str, str]:
    counts: dict[str, int] = {}
    for finding in findings:
        if finding.severity in BADGE_SEVERITIES:
            counts[finding.node] = counts.get(finding.node, 0) + 1
    return {node: f"{count} {BADGE_MARK}" for node, count in counts.items()}
