"""Resource monitoring: CPU and memory of the training process and of the machine (psutil), and per
GPU its utilisation and memory through NVML (``nvidia-ml-py``), sampled on a background thread.

Where there is no GPU (or no NVML library, or no driver) the answer is a stated reason
(``gpu_status``), never a number: a missing metric is a missing row, not a zero.

    >>> sampler = ResourceSampler(interval=1.0, sink=print)      # doctest: +SKIP
    >>> sampler.start(); ...; sampler.stop()                      # doctest: +SKIP
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from comgra.errors import ConfigError
from comgra.store import format as fmt

Sample = tuple[str, str, float]  # (source, metric, value)


@dataclass
class GpuProbe:
    """NVML handles of the visible GPUs, or the reason why there are none."""

    handles: list[Any] = field(default_factory=list)
    status: str = ""
    _nvml: Any = None

    @classmethod
    def open(cls) -> GpuProbe:
        try:
            import pynvml
        except ImportError:
            return cls(status="no GPU: nvidia-ml-py is not installed (pip install nvidia-ml-py)")
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as error:
            return cls(status=f"no GPU: NVML is not available ({type(error).__name__}: {error})")
        if not handles:
            pynvml.nvmlShutdown()
            return cls(status="no GPU: NVML found no devices")
        return cls(handles, f"{len(handles)} GPU(s) through NVML", pynvml)

    def sample(self) -> list[Sample]:
        samples: list[Sample] = []
        for index, handle in enumerate(self.handles):
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except self._nvml.NVMLError:
                continue  # a device that does not answer now gives no sample, not a made-up one
            source = f"gpu:{index}"
            samples += [(source, "utilization_percent", float(rates.gpu)),
                        (source, "memory_used_bytes", float(memory.used)),
                        (source, "memory_total_bytes", float(memory.total))]
        return samples

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None


def cpu_and_memory(process: Any) -> list[Sample]:
    """psutil's view of this process and of the machine."""
    import psutil

    with process.oneshot():
        samples = [("process", "cpu_percent", process.cpu_percent()),  # since the previous call
                   ("process", "memory_bytes", float(process.memory_info().rss))]
    memory = psutil.virtual_memory()
    return samples + [("machine", "cpu_percent", psutil.cpu_percent()),
                      ("machine", "memory_bytes", float(memory.used)),
                      ("machine", "memory_percent", float(memory.percent))]


class _FromConfig:
    """The default of ``resource_seconds``: the interval comes from comgra.toml."""

    def __repr__(self) -> str:
        return "<[profiling] resource_interval_s of comgra.toml (1.0 without one; 0: off)>"


FROM_CONFIG: Any = _FromConfig()
DEFAULT_KEPT_SAMPLES = 3600


def resolve_interval(argument: object, configured: float) -> float | None:
    """The sampling interval: the recorder's ``resource_seconds`` where given, else comgra.toml's
    ``[profiling] resource_interval_s`` (0 there: off)."""
    if argument is FROM_CONFIG:
        return float(configured) if configured else None
    return check_interval(argument)


def check_interval(interval: object) -> float | None:
    """``resource_seconds``: None (off) or a number of seconds > 0."""
    if interval is not None and (not isinstance(interval, (int, float)) or isinstance(interval, bool)
                                 or not interval > 0):
        raise ConfigError(f"resource_seconds={interval!r} must be a number of seconds > 0, e.g. 1.0, "
                          "or None to switch resource sampling off.")
    return interval  # type: ignore[return-value]


class ResourceSampler:
    """Samples every ``interval`` seconds until ``stop``; hands tables of rows to ``sink``.

    ``step`` tells which training step is running, so that samples can be set beside the steps.
    Samples are handed on in batches (every ``batch_seconds``), not one table per sample; the last
    ``keep`` samples (one per moment, all its metrics) also stay in memory, for ``recent()``.
    """

    def __init__(self, interval: float, sink: Callable[[pa.Table], None], *,
                 step: Callable[[], int | None] = lambda: None, batch_seconds: float = 5.0,
                 on_status: Callable[[dict[str, Any]], None] = lambda _status: None,
                 keep: int = DEFAULT_KEPT_SAMPLES):
        self.interval = float(check_interval(interval))  # type: ignore[arg-type]
        self.sink = sink
        self.step = step
        self.batch_seconds = batch_seconds
        self.on_status = on_status
        self.gpu = GpuProbe(status="not started")
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rows: list[dict[str, Any]] = []
        # Per moment its values, and its (source, metric) names shared with every moment that had the same:
        # kept as five dicts a moment, 3,600 moments held about 4 MiB, and memory grew through a run's first
        # hour; this way about 1.2 MiB.
        self._recent: deque[tuple[float, int, tuple[tuple[str, str], ...], tuple[float, ...]]] = \
            deque(maxlen=max(int(keep), 0))
        self._names: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}

    def recent(self) -> list[dict[str, Any]]:
        """The rows of the last ``keep`` samples, oldest first (the in-memory view of a run in progress)."""
        return [{"wall_time": now, "training_step": step, "source": source, "metric": metric, "value": value}
                for now, step, names, values in list(self._recent) for (source, metric), value in zip(names, values)]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="comgra-resources", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        try:
            import psutil

            process = psutil.Process(os.getpid())
            process.cpu_percent(), psutil.cpu_percent()  # the first call only sets the reference point
            self.gpu = GpuProbe.open()
            self.on_status({"interval_seconds": self.interval, "gpu_count": len(self.gpu.handles),
                            "gpu_status": self.gpu.status, "cpu_count": psutil.cpu_count()})
            handed = time.monotonic()
            while not self._stop.wait(self.interval):
                self._collect(cpu_and_memory(process) + self.gpu.sample())
                if time.monotonic() - handed >= self.batch_seconds:
                    self._hand_on()
                    handed = time.monotonic()
            self._collect(cpu_and_memory(process) + self.gpu.sample())  # the last moments of the run
            self._hand_on()
        except Exception as error:  # noqa: BLE001 - monitoring never stops training; the recorder reports it
            self.error = error
        finally:
            self.gpu.close()

    def _collect(self, samples: list[Sample]) -> None:
        now, step = time.time(), self.step()
        step = -1 if step is None else int(step)
        rows = [{"wall_time": now, "training_step": step, "source": source, "metric": metric,
                 "value": value} for source, metric, value in samples]
        self._rows += rows
        names = tuple((source, metric) for source, metric, _ in samples)
        self._recent.append((now, step, self._names.setdefault(names, names), tuple(value for *_, value in samples)))

    def _hand_on(self) -> None:
        if self._rows:
            rows, self._rows = self._rows, []
            self.sink(pa.Table.from_pylist(rows, schema=fmt.RESOURCES_SCHEMA))
