"""Findings saved beside the recording, so that a trial scanned once opens its findings at once.

A scan (``comgra scan`` or the app's background scanner) writes what it found for a trial to
``trials/<id>/analysis/findings-<options>.json``. The file is valid only for the data and the code
that made it: it names the trial's chunks (chunks are immutable, so the same names mean the same
data) and a fingerprint of everything else the findings depend on: comgra's version, a hash of the
analysis sources and of the code that reads chunks (``store/reader.py``, ``store/format.py``), the
versions of numpy, pandas, pyarrow, DuckDB, scipy and scikit-learn, and the sensitivity and thresholds.
A file with another fingerprint, a damaged file included, reads as "not saved", and the next scan
writes it again.

The file is also tied to the data it was computed from and to this user: it lists each chunk it read with its
size and modification time, and carries an HMAC over all of it made with this user's key
(``comgra.analysis.findings_key``). A file edited by hand, copied from someone else's recording or from another
trial, or one whose chunks were replaced, does not verify and is computed again: saved findings are a cache,
never a verdict.

The folder matches none of the store's globs (``*/tensors/*.parquet``, ``graphs/*.json``, ...),
files are written under a temporary name and renamed, and a recording that cannot be written to
(a read-only share) is scanned as before, only not saved. Light imports only: the app looks here
before it loads the detectors (pandas, scipy, scikit-learn take seconds to import).

    >>> saved = load(trial, signature, ScanOptions())      # doctest: +SKIP
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comgra.analysis import findings_key
from comgra.analysis.findings import FORMAT_VERSION, Finding, ScanOptions, signature_files

if TYPE_CHECKING:
    from comgra.store.reader import TrialReader

log = logging.getLogger("comgra.analysis")
FOLDER = "analysis"  # inside the trial folder
_FINDING_FIELDS = {f.name for f in fields(Finding)}


# What a saved finding depends on besides the data: the analysis sources, the code that reads a chunk
# for them, and the libraries whose numbers the detectors take as they come (scikit-learn's forest,
# scipy's p-values, numpy's and pandas' quantiles).
READ_SOURCES = ("store/reader.py", "store/format.py")
LIBRARIES = ("numpy", "pandas", "pyarrow", "duckdb", "scipy", "scikit-learn")


def watched_sources() -> list[Path]:
    """The source files whose change makes every saved finding stale."""
    package = Path(__file__).parent.parent
    return sorted(Path(__file__).parent.glob("*.py")) + [package / name for name in READ_SOURCES]


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, str]:
    """The code that made a finding: comgra's version, the formats, a hash of ``watched_sources`` and the
    versions of the libraries the detectors use. Read from the files and the installed packages'
    metadata, without importing the libraries (the app looks here before it loads them)."""
    from comgra._version import __version__
    from comgra.store.format import FORMAT_VERSION as STORE_FORMAT

    digest = hashlib.sha256()
    for source in watched_sources():
        digest.update(source.name.encode())
        digest.update(source.read_bytes() if source.exists() else b"(missing)")
    # The package version too: an install without sources (only .pyc files) still tells releases apart.
    found = {"comgra": __version__, "findings_format": str(FORMAT_VERSION), "store_format": str(STORE_FORMAT),
             "sources": digest.hexdigest()[:16]}
    found.update({name: _installed_version(name) for name in LIBRARIES})
    return found


def fingerprint(options: ScanOptions) -> dict[str, Any]:
    """Everything a saved finding is valid for besides the data: the code (``environment``) and the
    sensitivity and thresholds it was scanned at. Saved findings with another fingerprint are stale."""
    from comgra.analysis.custom import signature

    return {**environment(), "options": _options_of(options), "user_detectors": signature()}


@functools.lru_cache(maxsize=16)
def _options_of(options: ScanOptions) -> dict[str, Any]:
    """``asdict(options)``, once per options (the Runs view checks the saved findings of thousands of trials)."""
    return asdict(options)


def code_version() -> str:
    """A short name of ``environment()``, for a log line or a test."""
    return hashlib.sha256(json.dumps(environment(), sort_keys=True).encode()).hexdigest()[:16]


def _installed_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def path_of(trial_directory: Path, options: ScanOptions) -> Path:
    """One file per set of options (a scan at another sensitivity does not overwrite the default's)."""
    key = hashlib.sha256(json.dumps(_options_of(options), sort_keys=True).encode()).hexdigest()[:12]
    return trial_directory / FOLDER / f"findings-{key}.json"


@dataclass(frozen=True)
class SavedFindings:
    signature: tuple[str, ...]  # the trial's chunks when it was scanned
    findings: list[Finding]
    problems: list[str]


def read(trial: TrialReader, options: ScanOptions) -> SavedFindings | None:
    """What the current analysis code found in the trial at ``options``, at whatever data it was scanned;
    None if nothing is saved (never saved, older code, damaged, unreadable, or not verified: not signed by this
    user, edited, of another trial, or of chunks that changed since)."""
    path = path_of(trial.directory, options)
    try:
        document = json.loads(path.read_text())
        if document.get("fingerprint") != fingerprint(options):
            log.debug("comgra: saved findings %s are stale: %s", path, stale_parts(document.get("fingerprint"), options))
            return None
        if not _verified(document, trial):
            log.info("comgra: saved findings %s do not verify (edited, copied, or of other data); computing them "
                     "again", path)
            return None
        found = [Finding(**{k: v for k, v in item.items() if k in _FINDING_FIELDS}) for item in document["findings"]]
        return SavedFindings(tuple(str(name) for name in document["signature"]), found,
                             [str(p) for p in document["problems"]])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:  # damaged: scan again, then replace it
        log.debug("comgra: ignoring saved findings %s: %s", path, error)
        return None


def load(trial: TrialReader, signature: tuple[str, ...],
         options: ScanOptions) -> tuple[list[Finding], list[str]] | None:
    """The saved findings and problems of a trial at this data (``signature``), code and options; None if
    there are none."""
    kept = read(trial, options)
    if kept is None or kept.signature != tuple(signature):
        return None
    return kept.findings, kept.problems


def _signed_content(document: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in document.items() if k != "mac"}, sort_keys=True).encode()


def _verified(document: dict[str, Any], trial: TrialReader) -> bool:
    """Signed by this user, of this trial, and of chunks that are still the ones it was computed from."""
    if not findings_key.verify(_signed_content(document), document.get("mac")):
        return False
    if document.get("trial") != trial.trial_id:
        return False
    listed = document.get("files")
    if not isinstance(listed, list) or [str(name) for name in document["signature"]] != [
            Path(str(entry[0])).name for entry in listed]:
        return False
    return all(_stamp(trial.directory / str(relative), str(relative)) == [str(relative), size, mtime]
               for relative, size, mtime in listed)


def _stamp(path: Path, relative: str | None = None) -> list[Any] | None:
    try:
        info = path.stat()
    except OSError:
        return None  # gone (merged away, deleted): the findings are of data no longer there
    return [relative if relative is not None else str(path), info.st_size, info.st_mtime_ns]


def data_files(trial: TrialReader, signature: tuple[str, ...]) -> list[list[Any]] | None:
    """Each chunk of ``signature`` as [path relative to the trial folder, size, mtime]; None if the trial's chunks
    are no longer those of ``signature`` (a live run wrote or merged meanwhile)."""
    files = signature_files(trial)
    if tuple(p.name for p in files) != tuple(signature):
        return None
    stamps = [_stamp(p, os.path.relpath(p, trial.directory)) for p in files]
    return None if any(s is None for s in stamps) else stamps


def stale_parts(saved_fingerprint: Any, options: ScanOptions) -> list[str]:
    """The parts of a saved fingerprint that differ from the current one (what changed since the scan)."""
    current = fingerprint(options)
    if not isinstance(saved_fingerprint, dict):
        return ["fingerprint"]
    return sorted(k for k in set(current) | set(saved_fingerprint) if current.get(k) != saved_fingerprint.get(k))


def save(trial: TrialReader, signature: tuple[str, ...], options: ScanOptions,
         found: list[Finding], problems: list[str]) -> bool:
    """Write the findings of a trial, signed; False (and nothing written) where the recording is read-only, or
    where its chunks changed since they were read (the next scan computes them again)."""
    from comgra.store.format import write_json_atomic

    files = data_files(trial, signature)
    if files is None:
        return False
    document = {"fingerprint": fingerprint(options), "trial": trial.trial_id, "signature": list(signature),
                "files": files, "findings": [plain(asdict(f)) for f in found], "problems": list(problems)}
    document["mac"] = findings_key.sign(_signed_content(json.loads(json.dumps(document))))
    try:
        (trial.directory / FOLDER).mkdir(exist_ok=True)  # not its parents: a trial deleted meanwhile stays deleted
        write_json_atomic(path_of(trial.directory, options), document)
    except OSError as error:  # read-only, full or gone: the scan's answer stands, it is only not kept
        log.debug("comgra: findings of %s not saved: %s", trial.directory, error)
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
