"""comgra.toml: the settings a user expects in a file rather than in code.

Looked up as ``comgra.toml`` in the working directory, unless a path is given (the recorder's
``config=`` argument, ``comgra --config PATH``). Every key is checked: an unknown key is an error that
names it and lists the known ones. Constructor arguments win over the file.

    # comgra.toml
    [app]
    refresh_interval_s = 2.0        # how often the app looks for new data of a run in progress
    token_for_reads = false         # true: every request needs the token printed at start (a shared machine)
    token = true                    # false: no token at all (127.0.0.1 only; a single-user machine)
    [anomalies]
    sensitivity = 1.0               # findings: 2 halves every detector's threshold (more findings), 0.5 doubles them
    detectors = []                  # user detectors, "module:function" (see comgra.analysis.custom)
    [history]
    layer_executions = 100          # per-layer profiling rows kept per module
    resource_samples = 3600         # resource samples kept in memory for the live plot
    [profiling]
    enabled = false
    flops_every_steps = 0           # 0: never count FLOPs
    resource_interval_s = 1.0
    [breakpoints]
    pause_timeout_s = 0             # 0: a paused run waits until told to continue
    poll_interval_s = 0.5           # how often the training process re-reads breakpoints.json
    sync_every_steps = 10           # torch.distributed: how often rank 0 shares the breakpoints
    sync_without_breakpoints = false  # torch.distributed: share them also in a run started without any
    collective_timeout_s = 300      # torch.distributed: a breakpoint collective that takes longer fails
    record_every_rank = true        # torch.distributed: every rank records a paused step in full
    [storage]                       # recordings at a URL (s3://, gs://, az://, hdfs://): see docs/object-storage.md
    spool_dir = ""                  # node-local folder of the local copy that is uploaded ("": the user's cache dir)
    spool_limit_gb = 20.0           # recording stops (training goes on) when this much waits for upload
    upload_timeout_s = 300.0        # finalize waits at most this long for the upload
    upload_delay_s = 10.0           # while training, a new chunk is sent once this old (the merges replace most first)
    keep_uploaded = false           # false: finalize removes a trial's spool files once the bucket holds them all
    [storage.options.s3]            # keyword arguments of the filesystem of a scheme (pyarrow.fs.S3FileSystem here)
    endpoint_override = "http://127.0.0.1:9000"
    [[breakpoints.set]]
    target = "loss"
    condition = "has_nan"
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from comgra.errors import ConfigError

__all__ = ["Settings", "load_settings", "FILE_NAME", "recording_around"]

FILE_NAME = "comgra.toml"


@dataclass(frozen=True)
class AppSettings:
    refresh_interval_s: float = 2.0
    token_for_reads: bool = False  # comgra --token-for-reads
    token: bool = True  # False: comgra --no-token


@dataclass(frozen=True)
class AnomalySettings:
    sensitivity: float = 1.0  # the default of comgra scan --sensitivity and of the app's Findings tab
    detectors: tuple[str, ...] = ()  # user detectors, "module:function" (comgra.analysis.custom)


@dataclass(frozen=True)
class HistorySettings:
    layer_executions: int = 100
    resource_samples: int = 3600


@dataclass(frozen=True)
class ProfilingSettings:
    enabled: bool = False
    flops_every_steps: int = 0
    resource_interval_s: float = 1.0


@dataclass(frozen=True)
class BreakpointSettings:
    pause_timeout_s: float = 0.0
    poll_interval_s: float = 0.5
    sync_every_steps: int = 10
    sync_without_breakpoints: bool = False
    collective_timeout_s: float = 300.0
    record_every_rank: bool = True
    set: tuple[dict[str, Any], ...] = ()

    @property
    def pause_timeout(self) -> float | None:
        return self.pause_timeout_s or None


@dataclass(frozen=True)
class StorageSettings:
    spool_dir: str = ""
    spool_limit_gb: float = 20.0
    upload_timeout_s: float = 300.0
    upload_delay_s: float = 10.0
    keep_uploaded: bool = False
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # scheme -> the filesystem's keyword arguments


@dataclass(frozen=True)
class Settings:
    app: AppSettings = field(default_factory=AppSettings)
    anomalies: AnomalySettings = field(default_factory=AnomalySettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    profiling: ProfilingSettings = field(default_factory=ProfilingSettings)
    breakpoints: BreakpointSettings = field(default_factory=BreakpointSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    source: str | None = None  # the file the settings came from, for messages
    ignored: str | None = None  # a comgra.toml of the working directory not read: it lies inside a recording


_SECTIONS: dict[str, type] = {"app": AppSettings, "anomalies": AnomalySettings, "history": HistorySettings,
                              "profiling": ProfilingSettings, "breakpoints": BreakpointSettings,
                              "storage": StorageSettings}
_BREAKPOINT_KEYS = ("target", "condition", "enabled")


def load_settings(path: str | Path | None = None, *, cwd: str | Path | None = None) -> Settings:
    """Read ``path`` (it must exist) or, without one, ``comgra.toml`` in ``cwd`` if there is one.

    A ``comgra.toml`` in a working directory that lies inside a recording (``cd downloaded_recording``) came
    with the recording, not from the user: it is not read (``Settings.ignored`` names it); pass it as
    ``path`` to read it anyway."""
    if path is None:
        candidate = Path(cwd if cwd is not None else Path.cwd()) / FILE_NAME
        if not candidate.is_file():
            return Settings()
        if recording_around(candidate.parent) is not None:
            return Settings(ignored=str(candidate))
        path = candidate
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config={str(path)!r} does not exist; pass the path of a comgra.toml file.") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{str(path)!r} is not a readable TOML file: {error}.") from None
    return settings_from_document(document, source=str(path))


def settings_from_document(document: dict[str, Any], *, source: str = "<config>") -> Settings:
    _reject_unknown(document, _SECTIONS, f"{source}: section")
    settings = Settings(source=source)
    for section, kind in _SECTIONS.items():
        values = document.get(section, {})
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{section}] must be a table, got {values!r}.")
        known = {f.name: f for f in fields(kind)}
        _reject_unknown(values, known, f"{source}: key in [{section}]")
        checked = {key: _check_value(section, key, value, known[key].default, source) for key, value in values.items()}
        settings = replace(settings, **{section: kind(**checked)})
    return settings


def _check_value(section: str, key: str, value: Any, default: Any, source: str) -> Any:
    where = f"{source}: {section}.{key}={value!r}"
    if section == "breakpoints" and key == "set":
        return _check_breakpoints(value, where)
    if section == "anomalies" and key == "detectors":
        if not isinstance(value, list) or not all(isinstance(v, str) and v.count(":") == 1 for v in value):
            raise ConfigError(f"{where} must be a list of 'module:function' strings, e.g. [\"my_checks:loss_above_ten\"].")
        return tuple(value)
    if section == "storage" and key in ("options", "spool_dir"):
        return _check_storage(key, value, where)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false.")
        return value
    if isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{where} must be a whole number >= 0, e.g. {default}.")
        return value
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where} must be a number >= 0, e.g. {default}.")
    return float(value)


def _check_storage(key: str, value: Any, where: str) -> Any:
    if key == "spool_dir":
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a folder path as a string, e.g. \"/local/scratch/comgra-spool\".")
        return value
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError(f"{where} must hold one table per scheme, e.g. [storage.options.s3] with "
                          "endpoint_override = \"http://127.0.0.1:9000\".")
    return {scheme.lower(): dict(options) for scheme, options in value.items()}


def _check_breakpoints(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    from comgra.breakpoints.control import _check_condition, _check_enabled, _check_target  # no torch, no cycle

    if not isinstance(value, list):
        raise ConfigError(f"{where} must be a list of [[breakpoints.set]] tables with target and condition.")
    checked = []
    for entry in value:
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: {entry!r} must be a table with target and condition.")
        _reject_unknown(entry, _BREAKPOINT_KEYS, f"{where}: key in a breakpoint")
        checked.append({"target": _check_target(entry.get("target")), "condition": _check_condition(entry.get("condition")),
                        "enabled": _check_enabled(entry.get("enabled", True))})
    return tuple(checked)


def _reject_unknown(values: dict[str, Any], known: Any, what: str) -> None:
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"Unknown {what}: {unknown}. Known: {sorted(known)}.")


def recording_around(path: str | Path) -> Path | None:
    """The recording folder that ``path`` lies in (or is), else None: a group (it has ``trials/``), a trial
    (``trial.json``), or anything below a ``trials`` folder. What lies there is data from whoever recorded
    it: comgra never imports, executes or takes settings from it."""
    try:
        here = Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    for folder in (here, *here.parents):
        try:
            if (folder / "trials").is_dir() or (folder / "trial.json").is_file():
                return folder
        except OSError:
            continue
        if folder.name == "trials" and folder.parent != folder:
            return folder.parent
    return None
