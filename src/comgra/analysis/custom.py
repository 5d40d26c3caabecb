"""Detectors of one's own: a function over the same plain data the built-in detectors get, registered by name.

    from comgra.analysis import Finding, register_detector

    def loss_above_ten(data, facts, options):            # data: TrialData, facts: GraphFacts, options: ScanOptions
        rows = data.stats[(data.stats["tensor_type"] == "loss") & (data.stats["mean"] > 10)]
        return [Finding(detector="loss_above_ten", severity="warning", score=0.5, trial=data.trial, node=str(n),
                        role=str(n), kind="forward", training_step=int(s), message=f"loss above 10 at step {s}")
                for n, s in zip(rows["node"], rows["training_step"])]

    register_detector("loss_above_ten", loss_above_ten)

``comgra scan`` and the app (and so its REST API) run the registered detectors after the built-in ones, in the
same way: a detector that raises is reported with the scan's problems, the others still run. A process that
did not run your code learns of a detector from comgra.toml (``[anomalies] detectors = ["my_package.checks:
loss_above_ten"]``, imported on first scan), from the entry-point group ``comgra.detectors``, or from the command
line (``comgra scan --detector module:function``). A module that lies inside a recording folder is never
imported for comgra.toml, wherever the command runs from (``PYTHONPATH=.``, ``python -m``): a recording from
someone else is data, not code (``comgra.config.recording_around``). Light imports only: this module is read
before the detectors' libraries are loaded.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from comgra.errors import ConfigError

ENTRY_POINT_GROUP = "comgra.detectors"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_registered: dict[str, Callable[..., Any]] = {}
_lock = threading.Lock()
_entry_points_loaded = False


def register_detector(name: str, function: Callable[..., Any], *, replace: bool = False) -> None:
    """Run ``function(data, facts, options) -> list[Finding]`` in every scan of this process, as detector ``name``."""
    from comgra.analysis.detectors_names import BUILT_IN

    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"register_detector(name={name!r}): use letters, digits, '_', '.' and '-', e.g. 'my_check'.")
    if not callable(function):
        raise ConfigError(f"register_detector({name!r}, {function!r}): the detector must be a function "
                          "(data, facts, options) -> list[Finding].")
    if name in BUILT_IN:
        raise ConfigError(f"register_detector({name!r}): a built-in detector has that name; choose another. "
                          f"Built-in: {sorted(BUILT_IN)}.")
    with _lock:
        if name in _registered and _registered[name] is not function and not replace:
            raise ConfigError(f"A detector {name!r} is registered already ({_registered[name]!r}); pass replace=True "
                              "to replace it or unregister_detector first.")
        _registered[name] = function


def unregister_detector(name: str) -> None:
    with _lock:
        _registered.pop(name, None)


def registered() -> dict[str, Callable[..., Any]]:
    """The user detectors, by name, those of the entry-point group ``comgra.detectors`` included."""
    _load_entry_points()
    with _lock:
        return dict(_registered)


def load_configured(specs: Iterable[str], *, explicit: Iterable[str] = ()) -> list[str]:
    """Import and register the ``module:function`` detectors a comgra.toml names (``specs``: never from inside
    a recording) and those named on the command line (``explicit``: the user's own choice); returns their names."""
    names = []
    for spec, where in [*((s, "[anomalies] detectors") for s in specs), *((s, "--detector") for s in explicit)]:
        function = _imported(spec, where, trusted=where == "--detector")
        name = spec.rsplit(":", 1)[1]
        register_detector(name, function, replace=True)
        names.append(name)
    return names


def signature() -> dict[str, str]:
    """Per user detector, a hash of its source (or its qualified name): saved findings depend on them."""
    found = {}
    for name, function in sorted(registered().items()):
        try:
            text = inspect.getsource(function)
        except (OSError, TypeError):
            text = f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', repr(function))}"
        found[name] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return found


def _imported(spec: str, where: str, *, trusted: bool = False) -> Callable[..., Any]:
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError(f"{where}: {spec!r} must be 'module:function', e.g. 'my_package.checks:loss_above_ten'.")
    module_name, attribute = spec.split(":")
    try:
        if not trusted:
            _check_not_in_a_recording(module_name, spec, where)
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"{where}: cannot import {module_name!r} for {spec!r} ({error}); is it installed or on "
                          "PYTHONPATH?") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigError(f"{where}: {module_name!r} has no function {attribute!r} (for {spec!r}).")
    return function  # type: ignore[no-any-return]


def _check_not_in_a_recording(module_name: str, spec: str, where: str) -> None:
    """Refuse (ConfigError) a module whose file lies inside a recording folder, before anything of it runs: each
    package on the way is located first (``find_spec`` of a top-level name executes nothing)."""
    from comgra.config import recording_around

    parts = module_name.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        found = importlib.util.find_spec(name)  # imports the parents, each checked one round before
        if found is None:
            return  # import_module reports it
        places = [found.origin] if found.origin and found.has_location else []
        places += list(found.submodule_search_locations or [])
        for place in places:
            folder = recording_around(place)
            if folder is not None:
                raise ConfigError(f"{where}: {spec!r} would import {str(place)[:200]!r}, which lies inside the recording "
                                  f"{str(folder)[:200]!r}; comgra never runs code that comes with a recording. Install "
                                  "the detector as a package, or name it yourself with 'comgra scan --detector'.")


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            register_detector(entry.name, entry.load(), replace=True)
        except Exception:  # noqa: BLE001 - a broken plug-in must not stop the scan; the detector is simply absent
            continue
