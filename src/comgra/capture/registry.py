"""What a recorded step knows about each registered tensor."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

RECORDING_TYPES = ("neuron", "kpis", "kpis_and_svd", "single_value")
TENSOR_TYPES = ("input", "target", "loss", "parameter", "calculated", "initial_value")


@dataclass
class Registration:
    """One named tensor of one iteration. ``tensor`` is dropped at the end of the step."""

    tensor_name: str
    iteration: int  # -1: parameters and initial values
    node: str
    role: str
    tensor_type: str
    recording_type: str
    batch_dim: int | None  # None: no batch dimension
    per_sample: bool
    shape: tuple[int, ...]
    tensor: torch.Tensor | None
    # The autograd node the tensor had when it was registered; an in-place op afterwards replaces the
    # tensor's grad_fn, and the graph must be walked from this one. Dropped with ``tensor``.
    grad_fn: Any = None
    # The registration of the same tensor under an earlier name, if any: its only source in the graph.
    same_as: tuple[int, str] | None = None
    # The class of the module whose output this is ("ReLU"), where comgra.watch found it: the graph's label.
    module_type: str = ""
    # (iteration, tensor_name), made once: a step keeps it in five places per tensor (registrations, names,
    # ids, autograd nodes, the gradient hook), and one tuple instead of five is fewer objects for the garbage
    # collector to count (a recorded step of ResNet-18 holds 90 registrations).
    key: tuple[int, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.key = (self.iteration, self.tensor_name)

    def batch_first(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` (the tensor or its gradient) as (B, ...) or (1, ...) without a batch dimension."""
        if self.batch_dim is None:
            return value.reshape(1, -1)
        return value.movedim(self.batch_dim, 0) if self.batch_dim else value
