"""Findings saved beside the recording, so that a trial scanned once opens its findings at once.

A scan (``comgra scan`` or the app's background scanner) writes what it found for a trial to
``trials/<id>/analysis/findings-<options>.json``. The file is valid only for the data and the code
that made it: it names the trial's chunks (chunks are immutable, so the same names mean the same
data), the analysis code's version (a hash of its sources) and the scan options. Anything else, a
damaged file included, reads as "not saved", and the next scan writes it again.

The folder matches none of the store's globs (``*/tensors/*.parquet``, ``graphs/*.json``, ...),
files are written under a temporary name and renamed, and a recording that cannot be written to
(a read-only share) is scanned as before, only not saved. Light imports only: the app looks here
before it loads the detectors (pandas, scipy, scikit-learn take seconds to import).

    >>> saved = load(trial_directory, signature, ScanOptions())      # doctest: +SKIP
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from comgra.analysis.findings import FORMAT_VERSION, Finding, ScanOptions

log = logging.getLogger("comgra.analysis")
FOLDER = "analysis"  # inside the trial folder
_FINDING_FIELDS = {f.name for f in fields(Finding)}


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of the analysis package's sources and the store's format: a changed detector (or a
    changed way of reading chunks) makes every saved finding stale without anyone bumping a number."""
    from comgra import __version__
    from comgra.store.format import FORMAT_VERSION as STORE_FORMAT

    # The package version too: an install without sources (only .pyc files) still tells releases apart.
    digest = hashlib.sha256(f"comgra {__version__} findings {FORMAT_VERSION} store {STORE_FORMAT}".encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def path_of(trial_directory: Path, options: ScanOptions) -> Path:
    """One file per set of options (a scan at another sensitivity does not overwrite the default's)."""
    key = hashlib.sha256(json.dumps(asdict(options), sort_keys=True).encode()).hexdigest()[:12]
    return trial_directory / FOLDER / f"findings-{key}.json"


@dataclass(frozen=True)
class SavedFindings:
    signature: tuple[str, ...]  # the trial's chunks when it was scanned
    findings: list[Finding]
    problems: list[str]


def read(trial_directory: Path, options: ScanOptions) -> SavedFindings | None:
    """What the current analysis code found in the trial at ``options``, at whatever data it was scanned;
    None if nothing is saved (never saved, older code, damaged or unreadable)."""
    path = path_of(trial_directory, options)
    try:
        document = json.loads(path.read_text())
        if document.get("code_version") != code_version() or document.get("options") != asdict(options):
            return None
        found = [Finding(**{k: v for k, v in item.items() if k in _FINDING_FIELDS}) for item in document["findings"]]
        return SavedFindings(tuple(str(name) for name in document["signature"]), found,
                             [str(p) for p in document["problems"]])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:  # damaged: scan again, then replace it
        log.debug("comgra: ignoring saved findings %s: %s", path, error)
        return None


def load(trial_directory: Path, signature: tuple[str, ...],
         options: ScanOptions) -> tuple[list[Finding], list[str]] | None:
    """The saved findings and problems of a trial at this data (``signature``), code and options; None if
    there are none."""
    kept = read(trial_directory, options)
    if kept is None or kept.signature != tuple(signature):
        return None
    return kept.findings, kept.problems


def save(trial_directory: Path, signature: tuple[str, ...], options: ScanOptions,
         found: list[Finding], problems: list[str]) -> bool:
    """Write the findings of a trial; False (and nothing written) where the recording is read-only."""
    from comgra.store.format import write_json_atomic

    document = {"code_version": code_version(), "signature": list(signature), "options": asdict(options),
                "findings": [plain(asdict(f)) for f in found], "problems": list(problems)}
    try:
        (trial_directory / FOLDER).mkdir(exist_ok=True)  # not its parents: a trial deleted meanwhile stays deleted
        write_json_atomic(path_of(trial_directory, options), document)
    except OSError as error:  # read-only, full or gone: the scan's answer stands, it is only not kept
        log.debug("comgra: findings of %s not saved: %s", trial_directory, error)
        return False
    return True


def plain(value: Any) -> Any:
    """JSON types without loss: numpy scalars become Python numbers, tuples lists; NaN and inf stay
    floats (``json`` writes them as NaN and Infinity), so a saved finding reads back equal."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def normalized(found: list[Finding]) -> list[Finding]:
    """Findings as they read back from a saved file, so that a fresh scan and a saved one are equal."""
    return [Finding(**plain(asdict(f))) for f in found]
