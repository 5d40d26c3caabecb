"""The recorders of this process and the trials they hold open.

A notebook runs the cell that makes the recorder again, and the new recorder names the same trial
(same root, group and trial_id) while the earlier one still holds it: its writer may not have written
the last steps yet, and it may be inside a step an exception interrupted. Before the new recorder opens
the trial, ``finish_earlier`` finishes the earlier recorder (its half step dropped, everything else
written) and keeps what it recorded as a trial of its own beside the new one, ``<trial_id>~1`` (then
``~2``, ...): the trial id always names the latest run, as it does when a script is run again, and the
earlier runs of this process stay readable in the app. A trial recorded by another process (a script
run before, a notebook before its kernel restarted) is moved to ``GROUP/.replaced/`` as before
(``session._move_aside_earlier_trial``). At interpreter exit every recorder still open is finalized.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

from comgra.capture.options import RecorderOptions
from comgra.errors import RecordingError
from comgra.store import format as fmt
from comgra.store import layout

# (trial folder, rank) -> the recorder that holds it open now (weakly: a recorder nobody holds is not kept alive)
_OPEN: dict[tuple[Path, int], weakref.ref[Any]] = {}
# The trial folders this process recorded into (open or finished): their earlier runs are kept beside the new one
_RECORDED_HERE: set[Path] = set()
_LOCK = threading.Lock()
# Recorders finished because a new one took their trial -> the message their next start_batch raises
_REPLACED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
EARLIER_RUN_MARK = "~"


def finish_earlier(options: RecorderOptions, rank: int, world_size: int) -> str | None:
    """Before a recorder opens its trial: finish a recorder of this process that holds the same trial, and
    (one process recording alone) keep a trial this process recorded before as ``<trial_id>~N``.

    Returns the name the earlier run is kept under, or None where there was none to keep."""
    directory = fmt.trial_dir(options.group_dir, options.trial_id)
    with _LOCK:
        reference = _OPEN.pop((directory, rank), None)
    earlier = reference() if reference is not None else None
    if earlier is not None:
        earlier.abandon_step()  # an exception interrupted its step: nothing of the half step is stored
        earlier.finalize()  # its writer writes what it holds and lets go of the folder
    kept = _keep_beside(directory, options.trial_id) \
        if world_size == 1 and directory in _RECORDED_HERE and (directory / fmt.TRIAL_META).is_file() else None
    if earlier is not None:
        _REPLACED[earlier] = (f"This ComgraRecorder of trial {options.trial_id!r} was finished when a new "
                              f"ComgraRecorder for the same trial was made (a notebook cell run again)"
                              f"{_kept_as(kept)}, and records nothing more. Record through the new recorder, "
                              "e.g. comgra.my_recorder.")
    if kept is None:  # nothing recorded before, a shard of a distributed run, or a trial of another process:
        return None  # session.py moves it aside
    print(f"comgra: trial {options.trial_id!r} was recorded before in this process; that recording is kept as "
          f"trial {kept.name!r}, and trial {options.trial_id!r} is the new run", file=sys.stderr)
    return kept.name


def check_not_replaced(recorder: Any) -> None:
    """At start_batch: a recorder that a new one replaced says so, instead of recording into a closed trial."""
    message = _REPLACED.get(recorder)
    if message is not None:
        raise RecordingError(message)


def _kept_as(kept: Path | None) -> str:
    return f"; its steps are kept as trial {kept.name!r}" if kept is not None else ""


def _keep_beside(directory: Path, trial_id: str) -> Path | None:
    """Rename the trial folder to ``<trial_id>~N``; None where it cannot be (session.py moves it aside, or reports
    why it cannot)."""
    kept = _free_sibling(directory)
    try:
        os.rename(directory, kept)
        # Format 3: the trial's tables live outside its folder (store/layout.py) and are renamed with it.
        layout.move_trial_partitions(layout.group_of(directory), trial_id, new_id=kept.name)
    except OSError:
        return None
    _name_the_copy(kept, trial_id)
    return kept


def hold(recorder: Any, directory: Path, rank: int) -> None:
    """``recorder`` holds its trial open from now on, until ``release``; it is finalized at exit if still open."""
    with _LOCK:
        _OPEN[(directory, rank)] = weakref.ref(recorder)
        _RECORDED_HERE.add(directory)
    atexit.register(_finalize_quietly, weakref.ref(recorder))


def release(recorder: Any) -> None:
    """``recorder`` (finalized) holds its trial no longer."""
    if recorder.session is None:
        return
    key = (recorder.session.directory, recorder.rank_info.rank)
    with _LOCK:
        reference = _OPEN.get(key)
        if reference is not None and reference() in (recorder, None):
            del _OPEN[key]


def _free_sibling(directory: Path) -> Path:
    number = 1
    while (directory.parent / f"{directory.name}{EARLIER_RUN_MARK}{number}").exists():
        number += 1
    return directory.parent / f"{directory.name}{EARLIER_RUN_MARK}{number}"


def _name_the_copy(kept: Path, trial_id: str) -> None:
    """trial.json of the kept run says what it is (a reader names a trial by its folder; this is for people)."""
    try:
        metadata = json.loads((kept / fmt.TRIAL_META).read_text())
        metadata.update(trial_id=kept.name, earlier_run_of=trial_id)
        fmt.write_json_atomic(kept / fmt.TRIAL_META, metadata)
    except (OSError, ValueError):  # the copy stays readable under its folder's name without this
        pass


def _finalize_quietly(reference: weakref.ref[Any]) -> None:
    recorder = reference()
    if recorder is not None:
        try:
            recorder.finalize()
        except Exception:  # noqa: BLE001 - at interpreter exit there is no one left to tell
            pass
