"""Run every detector over the trials of a recording and rank what they find.

A ``Scanner`` keeps what it read per chunk, so scanning a live run again reads only the chunks
written since; findings are recomputed only when a trial's chunks changed.

    >>> scanner = Scanner()                                        # doctest: +SKIP
    >>> result = scanner.scan("runs/my_group")                     # doctest: +SKIP
    >>> [f.message for f in result.findings[:3]]                   # doctest: +SKIP
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comgra.analysis import findings_table, saved
from comgra.analysis.findings import Finding, ScanOptions, rank_findings, trial_signature
from comgra.errors import SelectionError, did_you_mean
from comgra.store.reader import GroupReader, TrialReader

if TYPE_CHECKING:
    from comgra.analysis.loading import ChunkCache, TrialData

MAX_PARALLEL_TRIALS = 4
# A scan that lets go of each trial collects cycles every this many trials (a full collection costs about 0.1 s
# of CPU; the trim that follows every trial a few milliseconds).
COLLECT_EVERY_TRIALS = 25


def detect_all(data: TrialData, options: ScanOptions) -> tuple[list[Finding], list[str]]:
    """Every detector over one trial (``comgra.analysis.detectors``, imported on first use)."""
    from comgra.analysis.detectors import detect_all as run_detectors

    return run_detectors(data, options)


_preloading: list[threading.Thread] = []
_preload_lock = threading.Lock()


def _import_detectors_beside() -> None:
    """Import the detectors' libraries (scipy, scikit-learn: a second or two) in a thread of their own
    while the chunks are read: that time overlaps the reading instead of adding to it."""
    def work() -> None:
        try:
            import comgra.analysis.detectors  # noqa: F401
            import sklearn.ensemble  # noqa: F401 - the outlier detector's IsolationForest
        except Exception:  # noqa: BLE001 - detect_all imports them again and reports what fails
            return

    with _preload_lock:
        if not _preloading:
            _preloading.append(threading.Thread(target=work, name="comgra-scan-import"))
            _preloading[0].start()


def __getattr__(name: str) -> Any:
    if name == "DETECTORS":
        from comgra.analysis.detectors import DETECTORS

        return DETECTORS
    raise AttributeError(f"module 'comgra.analysis.scan' has no attribute {name!r}")


@dataclass
class ScanResult:
    findings: list[Finding] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # skipped chunks, failed detectors
    trials: list[str] = field(default_factory=list)


class Scanner:
    """Scans trials; keeps per chunk what it read and per trial what it found. Thread-safe.

    With ``persist=True`` (``comgra scan`` and the app) it also reads and writes the findings saved in
    the recording (``comgra.analysis.saved``): a trial whose chunks and analysis code did not change
    since it was last scanned is not scanned again, in this process or any other.
    """

    def __init__(self, *, persist: bool = False, keep_chunks: bool = True) -> None:
        self.persist = persist
        # False (``comgra scan`` of a sweep): a trial's chunks, reader and answer are let go of as soon as its
        # findings are saved, so that memory stays flat in the number of trials.
        self.keep_chunks = keep_chunks
        self._cache: ChunkCache | None = None
        self._found: dict[tuple[str, str, ScanOptions], tuple[tuple[str, ...], list[Finding], list[str]]] = {}
        self._lock = threading.Lock()
        self._trial_locks: dict[tuple[str, str], threading.Lock] = {}
        self._forgotten = 0

    @property
    def cache(self) -> ChunkCache:
        """What was read per chunk (created on first use: loading it imports pandas)."""
        with self._lock:
            if self._cache is None:
                from comgra.analysis.loading import ChunkCache

                self._cache = ChunkCache()
            return self._cache

    def scan(self, path: str | Path | GroupReader, *, trials: list[str] | None = None,
             options: ScanOptions | None = None, progress: Callable[[str, int, int], None] | None = None,
             on_trial: Callable[[str, int, int], None] | None = None) -> ScanResult:
        """Findings of ``trials`` (default: all), most useful first. ``progress(trial, done, total)`` is
        called once per chunk read, ``on_trial(trial, trials_done, trials_total)`` once per trial finished.
        A trial's reader (opened here) is let go of once it is scanned, and with ``keep_chunks=False`` its
        chunks too: the memory a scan of a whole sweep holds does not grow with its trials."""
        group = path if isinstance(path, GroupReader) else GroupReader(path)
        options = options or ScanOptions()
        known = group.trials()
        wanted = known if trials is None else trials
        for trial_id in wanted:
            if trial_id not in known:
                raise SelectionError(f"No trial {trial_id!r} in {str(group.path)!r}" + did_you_mean(trial_id, known))
        result = ScanResult(trials=list(wanted))
        # Trials are independent: scanned side by side (DuckDB, Arrow and NumPy release the GIL for
        # most of a scan), their answers gathered in the order asked.
        workers = max(1, min(len(wanted), os.cpu_count() or 1, MAX_PARALLEL_TRIALS))
        finished = [0]
        finished_lock = threading.Lock()

        def one(trial_id: str) -> tuple[list[Finding], list[str]]:
            answer = self.scan_and_release(group, trial_id, options, progress)
            with finished_lock:
                finished[0] += 1
                count = finished[0]
            if on_trial is not None:
                on_trial(trial_id, count, len(wanted))
            return answer

        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="comgra-scan") as pool:
            answers = list(pool.map(one, wanted))
        for found, problems in answers:
            result.findings.extend(found)
            result.problems.extend(problems)
        result.findings = rank_findings(result.findings)
        return result

    def scan_and_release(self, group: GroupReader, trial_id: str, options: ScanOptions,
                         progress: Callable[[str, int, int], None] | None = None) -> tuple[list[Finding], list[str]]:
        """``scan_trial``, then let go of what the trial left behind: its reader if this call opened it
        (a trial the caller has open stays open) and, with ``keep_chunks=False``, its chunks."""
        was_open = group.is_open(trial_id)
        try:
            return self.scan_trial(group, trial_id, options, progress)
        finally:
            self.forget(group, trial_id, reader=not was_open)

    def forget(self, group: GroupReader, trial_id: str, *, reader: bool = True, chunks: bool | None = None) -> None:
        """Let go of a scanned trial's reader (``reader``) and, with ``chunks`` (default: ``keep_chunks=False``),
        of its chunks and its answer (the saved findings answer the next scan), and give the freed memory back."""
        if reader:
            group.forget(trial_id)
        if not (not self.keep_chunks if chunks is None else chunks):
            return
        directory = str(_trial_folder(group, trial_id))
        with self._lock:
            cache = self._cache
            for key in [k for k in self._found if k[0] == str(group.path) and k[1] == trial_id]:
                del self._found[key]
            self._trial_locks.pop((str(group.path), trial_id), None)
            self._forgotten += 1
            collect = self._forgotten % COLLECT_EVERY_TRIALS == 0
        if cache is not None:
            cache.forget(directory)
        from comgra.analysis.loading import return_freed_memory

        return_freed_memory(collect=collect)

    def scan_trial(self, group: GroupReader, trial_id: str, options: ScanOptions,
                   progress: Callable[[str, int, int], None] | None = None) -> tuple[list[Finding], list[str]]:
        """Findings and problems of one trial; a second caller of the same trial waits for the first
        and gets its answer instead of scanning again."""
        with self._lock:
            trial_lock = self._trial_locks.setdefault((str(group.path), trial_id), threading.Lock())
        with trial_lock:
            return self._scan_trial(group, trial_id, options, progress)

    def _scan_trial(self, group: GroupReader, trial_id: str, options: ScanOptions,
                    progress: Callable[[str, int, int], None] | None) -> tuple[list[Finding], list[str]]:
        trial = group.trial(trial_id)
        chunks = trial_signature(trial)
        key = (str(group.path), trial_id, options)
        with self._lock:
            cached = self._found.get(key)
        if cached is not None and cached[0] == chunks:
            return cached[1], cached[2]
        kept = saved.load(trial, chunks, options) if self.persist else None
        if kept is not None:
            if not findings_table.is_current(group.path, trial_id, options, chunks):  # e.g. last written at other options
                findings_table.write(group.path, trial_id, kept[0], options, chunks)
                _publish(group, [findings_table.path_of(group.path, trial_id)])
            with self._lock:
                self._found[key] = (chunks, *kept)
            return kept
        _import_detectors_beside()
        total, done = len(chunks), [0]

        def advance(count: int) -> None:
            done[0] += count
            if progress is not None:
                progress(trial_id, done[0], total)

        found, problems = self._detect(trial, options, advance, lambda done, total: progress(trial_id, done, total)
                                       if progress is not None else None)
        found = saved.normalized(found)  # the same objects a later process reads back from the saved file
        if self.persist:  # the table first, the signed JSON (what a later scan trusts) last
            findings_table.write(group.path, trial_id, found, options, chunks)
            saved.save(trial, chunks, options, found, problems)
            _publish(group, [findings_table.path_of(group.path, trial_id), saved.path_of(trial.directory, options)])
        with self._lock:
            self._found[key] = (chunks, found, problems)
        return found, problems

    def _detect(self, trial: TrialReader, options: ScanOptions, advance: Callable[[int], None],
                streamed_progress: Callable[[int, int], object]) -> tuple[list[Finding], list[str]]:
        """A trial that fits in memory is loaded whole (and its chunks kept for the next scan of a live run);
        a bigger one is streamed node group by node group (``comgra.analysis.streaming``)."""
        from comgra.analysis import loading

        if loading.recorded_rows(trial) <= loading.IN_MEMORY_ROWS:
            return detect_all(self.cache.load(trial, advance), options)
        from comgra.analysis import streaming

        return streaming.scan_trial(trial, options, streamed_progress)

    def release(self) -> None:
        """Let go of the chunks kept for the next scan (the app does once the findings are saved)."""
        with self._lock:
            if self._cache is not None:
                self._cache.clear()
        from comgra.analysis.loading import return_freed_memory

        return_freed_memory()


def _publish(group: GroupReader, paths: list[Path]) -> None:
    """A recording read from a URL: the findings just saved in its mirror go to the store too (store.remote)."""
    mirror = getattr(group, "mirror", None)
    if mirror is not None:
        mirror.publish(paths)


def _trial_folder(group: GroupReader, trial_id: str) -> Path:
    """The folder of a trial's JSON documents, the key of its chunks in the ``ChunkCache``."""
    from comgra.store import format as fmt

    return fmt.trial_dir(group.path, trial_id)
