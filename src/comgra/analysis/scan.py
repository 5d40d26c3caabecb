"""Run every detector over the trials of a recording and rank what they find.

A ``Scanner`` keeps what it read per chunk, so scanning a live run again reads only the chunks
written since; findings are recomputed only when a trial's chunks changed.

    >>> scanner = Scanner()                                        # doctest: +SKIP
    >>> result = scanner.scan("runs/my_group")                     # doctest: +SKIP
    >>> [f.message for f in result.findings[:3]]                   # doctest: +SKIP
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from comgra.analysis import cooccurrence, correlation, graphs, nonfinite, outliers, parameters, trends, units
from comgra.analysis.findings import Finding, ScanOptions, rank_findings, trial_signature
from comgra.analysis.loading import ChunkCache, TrialData
from comgra.errors import SelectionError, did_you_mean
from comgra.store.reader import GroupReader

log = logging.getLogger("comgra.analysis")
MAX_PARALLEL_TRIALS = 4
Detector = Callable[[TrialData, graphs.GraphFacts, ScanOptions], list[Finding]]
DETECTORS: dict[str, Detector] = {
    "non_finite": lambda data, facts, options: nonfinite.detect(data, facts),
    "gradients": trends.gradients,
    "growth": trends.growth,
    "collapse": trends.collapse,
    "dead_units": units.dead,
    "saturated_units": units.saturated,
    "one_sided": units.one_sided,
    "parameters": parameters.detect,
    "outliers": outliers.detect,
    "correlation": correlation.detect,
}


@dataclass
class ScanResult:
    findings: list[Finding] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # skipped chunks, failed detectors
    trials: list[str] = field(default_factory=list)


class Scanner:
    """Scans trials; keeps per chunk what it read and per trial what it found. Thread-safe."""

    def __init__(self) -> None:
        self.cache = ChunkCache()
        self._found: dict[tuple[str, str, ScanOptions], tuple[tuple[str, ...], list[Finding], list[str]]] = {}
        self._lock = threading.Lock()
        self._trial_locks: dict[tuple[str, str], threading.Lock] = {}

    def scan(self, path: str | Path | GroupReader, *, trials: list[str] | None = None,
             options: ScanOptions | None = None, progress: Callable[[str, int, int], None] | None = None) -> ScanResult:
        """Findings of ``trials`` (default: all), most useful first. ``progress(trial, done, total)`` is
        called once per chunk read."""
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
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="comgra-scan") as pool:
            answers = list(pool.map(lambda t: self.scan_trial(group, t, options, progress), wanted))
        for found, problems in answers:
            result.findings.extend(found)
            result.problems.extend(problems)
        result.findings = rank_findings(result.findings)
        return result

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
        total, done = len(chunks), [0]

        def advance(count: int) -> None:
            done[0] += count
            if progress is not None:
                progress(trial_id, done[0], total)

        data = self.cache.load(trial, advance)
        found, problems = detect_all(data, options)
        with self._lock:
            self._found[key] = (chunks, found, problems)
        return found, problems


def detect_all(data: TrialData, options: ScanOptions) -> tuple[list[Finding], list[str]]:
    """Every detector over one trial; a detector that fails is reported and the others still run."""
    facts = graphs.facts(data.graphs.values())
    if options.target is not None:
        correlation.pick_target(data, facts, options.target)  # an unknown --target is the user's error
    findings: list[Finding] = []
    problems = [f"skipped {p}" for p in data.problems]
    if not len(data.stats):
        return findings, problems
    for name, detector in DETECTORS.items():
        try:
            findings.extend(detector(data, facts, options))
        except SelectionError:
            raise
        except Exception as error:  # noqa: BLE001 - one detector's fault must not hide the others' findings
            log.debug("comgra: detector %s failed", name, exc_info=error)
            problems.append(f"detector {name} failed on trial {data.trial!r}: {type(error).__name__}: {error}")
    findings.extend(cooccurrence.detect(findings, int(data.steps["training_step"].nunique())))
    return rank_findings(findings), problems
