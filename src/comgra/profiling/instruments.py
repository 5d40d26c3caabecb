"""The recorder's live instruments: the per-layer profiler and the resource sampler.

Both are off until asked for (a module tracked with ``profile=True``; ``resource_seconds``), and
a fault in either is reported once and switches that instrument off: the training goes on.
"""
from __future__ import annotations

from typing import Any

import torch

from comgra.profiling.profiler import ProfileOptions, Profiler
from comgra.profiling.resources import DEFAULT_KEPT_SAMPLES, ResourceSampler

RESOURCES_DOCUMENT = "resources-r{rank:03d}.json"
COMPILED_MESSAGE = (
    "comgra measured no module call on a profiled step: the profiled model runs compiled (torch.compile), as one "
    "graph whose modules cannot be timed one by one. Its modules are measured (time, memory, FLOPs) on the steps "
    "that run eagerly: the recorded steps and the step that counts FLOPs; the compiled steps have no rows in the "
    "layers table. See the README's profiling section.")


class Instruments:
    def __init__(self, session: Any, *, profile: ProfileOptions, resource_seconds: float | None, rank: int = 0,
                 resource_samples: int = DEFAULT_KEPT_SAMPLES):
        self.session = session  # comgra.capture.session.Session, or None when recording is off
        self.profile_options = profile
        self.profiler: Profiler | None = None
        self.training_step: int | None = None
        self.sampler: ResourceSampler | None = None
        self.rank = rank
        if session is not None and not session.broken and resource_seconds is not None:
            self.sampler = ResourceSampler(resource_seconds, self._put_resources, step=lambda: self.training_step,
                                           on_status=self._put_status, keep=resource_samples)
            self.sampler.start()

    def profile(self, module_name: str, module: torch.nn.Module) -> None:
        if self.session is None:
            return
        if self.profiler is None:
            self.profiler = Profiler(self.profile_options)
        self.profiler.add(module_name, module)

    def start_step(self, training_step: int, recorded: bool) -> None:
        self.training_step = training_step
        if self.profiler is not None:
            self._guarded(lambda profiler: profiler.start_step(training_step, detail=recorded))

    @property
    def wants_eager_step(self) -> bool:
        """The step counts FLOPs (see Profiler.counts_flops): the recorder runs it eagerly, as a recorded step."""
        return self.profiler is not None and self.profiler.counts_flops

    def finish_step(self, force: bool = False, type_of_execution: str | None = None) -> None:
        if self.profiler is not None:
            self._guarded(lambda profiler: profiler.finish_step(type_of_execution))
        if self.profiler is not None and self.profiler.unmeasured_steps == 1:
            self.session.warn_once("instrument:compiled", COMPILED_MESSAGE)
        if self.profiler is not None:
            seconds = self.session.options.flush_seconds
            self._guarded(lambda profiler: self._put("layers", profiler.take(force=force, max_age=seconds)))
        if self.sampler is not None and self.sampler.error is not None:
            self._report("resource sampling", self.sampler.error)
            self.sampler.stop()
            self.sampler = None

    def abandon_step(self) -> None:
        if self.profiler is not None:
            self._guarded(lambda profiler: profiler.abandon_step())

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if self.profiler is not None:
            self._guarded(lambda profiler: self._put("layers", profiler.take(force=True)))
            if self.profiler is not None:
                self.profiler.close()
                self.profiler = None

    # -- plumbing -------------------------------------------------------------------------------
    def _put(self, table_name: str, table: Any) -> None:
        if table is not None and self.session is not None and not self.session.broken:
            self.session._put_table(table_name, table)

    def _put_resources(self, table: Any) -> None:
        # From the sampler's thread: the writer's queue is thread-safe; nothing else here is touched.
        writer = self.session.writer
        if writer is not None and not self.session.broken and table.num_rows:
            writer.put_table("resources", table)

    def _put_status(self, status: dict[str, Any]) -> None:
        writer = self.session.writer
        if writer is not None and not self.session.broken:
            writer.put_json(RESOURCES_DOCUMENT.format(rank=self.rank), status)

    def _guarded(self, action: Any) -> None:
        try:
            action(self.profiler)
        except Exception as error:  # noqa: BLE001 - profiling never stops training
            self._report("per-layer profiling", error)
            if self.profiler is not None:
                try:
                    self.profiler.close()
                finally:
                    self.profiler = None

    def _report(self, what: str, error: BaseException) -> None:
        self.session.warn_once(f"instrument:{what}", f"comgra switched {what} off after an internal error: "
                               f"{type(error).__name__}: {error}. Training and recording go on.")
