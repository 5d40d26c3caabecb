"""The recorder's private door for comgra.watch and the Trainer/Lightning callbacks (``comgra.integrations``):
module outputs and losses that comgra found, not the user. A mixin of ``ComgraRecorder``; not the documented API.
"""
from __future__ import annotations

from typing import Any

import torch


class WatchedTensors:
    """What ``ComgraRecorder`` offers comgra.watch and the callbacks (their names are theirs to call)."""

    current_stage: str
    _recording: bool
    _breakpoints: Any  # breakpoints.recording.RecorderBreakpoints, or None
    _evidence: Any  # capture.evidence.RunEvidence, or None

    def _guarded(self, action: Any) -> None: ...  # ComgraRecorder's

    def _takes_watched_tensors(self) -> bool:
        """Whether a watched module's output would be used now: inside an iteration of a recorded step (or
        of one a breakpoint watches). comgra.watch's hooks ask this first and return at once on False."""
        if self.current_stage != "forward":
            return False
        return self._recording or (self._breakpoints is not None and self._breakpoints.monitor.active)

    def _register_watched(self, tensor_name: str, tensor: torch.Tensor, index_of_batch_dimension: int | None,
                          is_loss: bool = False, is_input: bool = False, module_type: str = "") -> None:
        """``register_tensor`` for a module output that comgra.watch found (or a loss a callback found): a second
        name for a tensor that is already registered (a block returning its last layer's output) takes over as
        the name its consumers see, and the tensor never gets a warning for having no connection (the user
        did not pick it)."""
        arguments: dict[str, Any] = dict(index_of_batch_dimension=index_of_batch_dimension,
                                         flags=dict(is_input=is_input, is_parameter=False, is_target=False,
                                                    is_loss=is_loss, is_initial_value=False),
                                         recording_type=None, record_per_batch_index=None, node_name=None,
                                         role_within_node=None, watched=True, module_type=module_type)
        self._watched_sentinel(tensor_name, tensor, is_loss, is_input)
        if self._breakpoints is not None and self._breakpoints.monitor.active:
            self._breakpoints.register(tensor_name, tensor, arguments)
        if self._recording:
            self._guarded(lambda session: session.register(tensor_name, tensor, **arguments))

    def _watched_sentinel(self, tensor_name: str, tensor: torch.Tensor, is_loss: bool, is_input: bool = False) -> None:
        """A loss a callback found (or a model input comgra.watch found) on any step, recorded or not: the every-step
        sentinels take it (``capture.evidence``); a callback calls this where ``_takes_watched_tensors()`` is False."""
        if self._evidence is not None and self.current_stage == "forward":
            self._evidence.register(tensor_name, tensor, is_loss, self._recording, is_input)
