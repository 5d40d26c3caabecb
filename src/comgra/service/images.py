"""Registered tensors shaped like images, (N, C, H, W) with C of 1 or 3, as images per sample across the recorded
steps: TensorBoard's Images. The recorder keeps each sample's whole image up to 3x64x64 values
(``capture.summaries.IMAGE_VALUES``); a larger image keeps ``max_num_neurons_to_record`` values and is listed as
not drawable, with the setting that would make it so."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow.compute as pc

from comgra.store import TrialReader
from comgra.store import format as fmt

MAX_STEPS = 10  # the columns of the grid: steps evenly spaced over the recorded ones, the first and the last among them
MAX_SAMPLES = 8  # the rows: the first samples of the batch, as TensorBoard's max_outputs


@dataclass(frozen=True)
class ImageTensor:
    node: str
    role: str
    iteration: int
    channels: int
    height: int
    width: int
    kept: int  # values kept per sample

    @property
    def whole(self) -> bool:
        """Whether every value of a sample was kept: only then is the image drawn."""
        return self.kept >= self.channels * self.height * self.width

    @property
    def key(self) -> str:
        return f"{self.node}\x1f{self.role}\x1f{self.iteration}"

    @property
    def label(self) -> str:
        name = self.node if self.role in (self.node, "") else f"{self.node} · {self.role}"
        where = f", iteration {self.iteration}" if self.iteration > 0 else ""
        return f"{name} ({self.channels}×{self.height}×{self.width}{where})"


@dataclass
class ImageGrid:
    tensor: ImageTensor
    steps: list[int]  # the columns
    samples: list[int]  # the rows
    recorded_steps: int  # how many steps hold the tensor
    images: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)  # (sample, step) -> (H, W, C) values
    scale: tuple[float, float] = (0.0, 1.0)  # the values drawn black and white, the same for every image

    def pixels(self, sample: int, step: int) -> np.ndarray | None:
        """One image as uint8, (H, W) grey or (H, W, 3) RGB, on the grid's one scale; None where not recorded."""
        values = self.images.get((sample, step))
        if values is None:
            return None
        low, high = self.scale
        scaled = (np.nan_to_num(values, nan=low, posinf=high, neginf=low) - low) / ((high - low) or 1.0)
        image = np.clip(np.rint(scaled * 255), 0, 255).astype(np.uint8)
        return image[:, :, 0] if image.shape[2] == 1 else image


def image_tensors(trial: TrialReader, training_step: int) -> list[ImageTensor]:
    """The tensors of ``training_step`` shaped like images, with one row per sample (inputs first, then by name)."""
    rows = trial.selection(training_step=training_step, kind=fmt.FORWARD, aggregation="sample", sample=0,
                           columns=["node", "role", "iteration", "tensor_type", "shape", "neurons"])
    if rows.num_rows == 0:
        return []
    kept = pc.fill_null(pc.list_value_length(rows["neurons"]), 0).to_pylist()
    found: dict[str, tuple[str, ImageTensor]] = {}
    for row, count in zip(rows.select(["node", "role", "iteration", "tensor_type", "shape"]).to_pylist(), kept):
        shape = row["shape"] or []
        if len(shape) != 4 or shape[1] not in (1, 3) or shape[2] < 2 or shape[3] < 2:
            continue
        tensor = ImageTensor(row["node"], row["role"], int(row["iteration"]), int(shape[1]), int(shape[2]),
                             int(shape[3]), int(count))
        found.setdefault(tensor.key, (row["tensor_type"] or "", tensor))
    return [t for _, t in sorted(found.values(), key=lambda e: (e[0] != "input", e[1].node, e[1].role, e[1].iteration))]


def image_grid(trial: TrialReader, tensor: ImageTensor, *, max_steps: int = MAX_STEPS,
               max_samples: int = MAX_SAMPLES) -> ImageGrid:
    """The images of the first ``max_samples`` samples at up to ``max_steps`` recorded steps (one read per sample)."""
    grid = ImageGrid(tensor, [], [], 0)
    if not tensor.whole:
        return grid
    size = tensor.channels * tensor.height * tensor.width
    for sample in range(max_samples):
        table = trial.values_series(node=tensor.node, role=tensor.role, kind=fmt.FORWARD, iteration=tensor.iteration,
                                    aggregation="sample", sample=sample, rank=0)
        if table.num_rows == 0:
            break
        if sample == 0:
            steps = sorted(set(table["training_step"].to_pylist()))
            grid.recorded_steps = len(steps)
            picked = np.unique(np.linspace(0, len(steps) - 1, min(max_steps, len(steps))).round().astype(int))
            grid.steps = [steps[i] for i in picked]
        wanted = set(grid.steps)
        for step, values in zip(table["training_step"].to_pylist(), table["neurons"].to_pylist()):
            if step in wanted and values is not None and len(values) >= size:
                image = np.asarray(values[:size], dtype=np.float32)
                grid.images[(sample, step)] = image.reshape(tensor.channels, tensor.height, tensor.width).transpose(1, 2, 0)
        grid.samples.append(sample)
    grid.scale = _scale(list(grid.images.values()))
    return grid


def _scale(images: list[np.ndarray]) -> tuple[float, float]:
    """As TensorBoard reads images: values within [0, 1] or [0, 255] as they are; anything else stretched from its
    smallest to its largest finite value, one scale for the whole grid (so that steps compare)."""
    finite = [image[np.isfinite(image)] for image in images]
    finite = [values for values in finite if values.size]
    if not finite:
        return 0.0, 1.0
    low, high = float(min(v.min() for v in finite)), float(max(v.max() for v in finite))
    if low >= 0 and high <= 1:
        return 0.0, 1.0
    if low >= 0 and high <= 255:
        return 0.0, 255.0
    return low, high
