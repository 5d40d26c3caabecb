"""What one rank knows of a DTensor: additive moments and extrema of its local shard, placed by global row.

A DTensor (FSDP2's ``fully_shard`` parameters and their gradients, tensor-parallel activations) stands for a
tensor whose values are spread over the ranks of its device mesh. Each rank reads only its local shard
(``to_local()``): per row of the whole tensor (a sample where the tensor has a batch dimension, else one row)
the number of values it holds, their sum, sum of squares and sum of |x| in float64, its NaN and inf counts
(sums: additive across ranks) and its max and -min without NaN (extrema: combined with MAX), and the first
values of the row that it holds (a sum across ranks, each rank filling the positions in its box of the whole
tensor). capture/sharded.py adds these up across the ranks in a few packed collectives; nothing here talks to
another rank, so nothing here can wait for one.

Placements: ``Shard(d)`` gives each rank a box of the whole tensor (``compute_local_shape_and_global_offset``);
``Replicate`` gives every rank the same values, so only the ranks at coordinate 0 of every replicated mesh
dimension contribute (nothing is counted twice); ``Partial`` holds addends of the values, whose moments are not
the moments of the sum, so such a tensor is reduced first (``redistribute`` to ``Replicate`` on those mesh
dimensions: one all-reduce of the tensor's size, on the tensor's own mesh, for each such tensor, made by every
rank at the same call). Anything else (``_StridedShard`` of FSDP2 with tensor parallelism, a mesh that is not
the whole world) is left out with a warning that names it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from comgra.capture import fused
from comgra.capture.registry import Registration
from comgra.capture.stats import _all_cpu_sums

# The additive numbers of a row, in order; the extrema are (max, -min), both without NaN.
SUMS = ("count", "sum", "square_sum", "abs_sum", "nan_count", "inf_count")
EXTREMA = ("max", "negative_min")


@dataclass
class LocalPart:
    """This rank's contribution to one sharded tensor: ``rows`` x ``width`` values in all, of which this rank
    holds ``sums.shape[0]`` rows starting at ``row_offset``. ``owner`` False: a replica whose values another
    rank counts (its arrays are not added). ``neurons``: (local rows, kept) float64, zero where another rank
    holds the position."""

    kind: str
    registration: Registration
    rows: int
    width: int
    kept: int
    row_offset: int
    owner: bool
    sums: np.ndarray  # (local rows, len(SUMS)) float64
    extrema: np.ndarray  # (local rows, 2) float64
    neurons: np.ndarray  # (local rows, kept) float64
    placements: str

    def layout(self) -> tuple[Any, ...]:
        """What every rank must agree on before the packed buffers are added up."""
        r = self.registration
        return (self.kind, r.tensor_name, r.iteration, self.rows, self.width, self.kept)


def is_dtensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a torch.distributed DTensor (checked by name first: importing torch.distributed.tensor
    costs time, and a step checks every tensor)."""
    if type(tensor).__name__ != "DTensor":
        return False
    from torch.distributed.tensor import DTensor
    return isinstance(tensor, DTensor)


def waited(tensor: Any) -> Any:
    """The values of an AsyncCollectiveTensor (the local output of a tensor-parallel layer, a DTensor's local shard
    after a redistribution): waiting for its collective is what reading it at all would do; anything else as it is."""
    return tensor.wait() if type(tensor).__name__ == "AsyncCollectiveTensor" else tensor


def unsupported(tensor: Any) -> str | None:
    """Why the shards of this DTensor cannot be combined, as the end of a sentence, or None where they can."""
    import torch.distributed as dist
    from torch.distributed.tensor import Partial, Replicate, Shard
    mesh = tensor.device_mesh
    for placement in tensor.placements:
        if not (type(placement) is Shard or isinstance(placement, (Replicate, Partial))):
            return (f"because its placement {placement!r} (of {tuple(tensor.placements)!r}) is not one whose shards "
                    "comgra can combine (Shard, Replicate and Partial are)")
    world = dist.get_world_size() if dist.is_initialized() else 1
    if mesh.size() != world:
        return (f"because its device mesh holds {mesh.size()} of the world's {world} ranks (a sub-mesh): comgra "
                "combines shards over the whole world, where other ranks would hold other tensors")
    return None


def local_part(kind: str, registration: Registration, tensor: Any, max_neurons: int) -> LocalPart:
    """This rank's part of the DTensor ``tensor`` (its value or a gradient) registered as ``registration``."""
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    with torch.no_grad():
        if any(isinstance(p, Partial) for p in tensor.placements):  # addends: reduce them first (module docstring)
            tensor = tensor.detach().redistribute(
                tensor.device_mesh, [Replicate() if isinstance(p, Partial) else p for p in tensor.placements])
        mesh, placements = tensor.device_mesh, tuple(tensor.placements)
        coordinate = mesh.get_coordinate() or [0] * mesh.ndim
        owner = all(coordinate[i] == 0 for i, p in enumerate(placements) if isinstance(p, Replicate))
        _, offset = compute_local_shape_and_global_offset(tensor.shape, mesh, placements)
        local = waited(tensor.to_local()).detach()
        shape = tuple(tensor.shape)
        if registration.batch_dim is None:
            global_shape, local_shape, offset = (1, *shape), (1, *local.shape), (0, *offset)
            local = local.reshape(local_shape)
        else:
            b = registration.batch_dim
            global_shape = (shape[b], *shape[:b], *shape[b + 1:])
            offset = (offset[b], *offset[:b], *offset[b + 1:])
            local = local.movedim(b, 0)
            local_shape = tuple(local.shape)
        width = int(np.prod(global_shape[1:], dtype=np.int64))
        cap = 0 if registration.recording_type in ("kpis", "kpis_and_svd") else max_neurons
        kept = min(width, cap)
        rows = local_shape[0]
        flat = local.reshape(rows, -1)
        sums, extrema = row_moments(flat)
        neurons = _first_values(local, global_shape, offset, kept)
    return LocalPart(kind, registration, global_shape[0], width, kept, int(offset[0]) if rows else 0, owner,
                     sums, extrema, neurons, repr(placements))


def row_moments(flat: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(rows, len(SUMS)) and (rows, 2) float64 of a (rows, width) tensor: see SUMS and EXTREMA. On the CPU with
    comgra's one-pass kernel (capture/fused.py) where it can read the values; rows with NaN or inf get the
    exact counts and the extrema of their other values from torch."""
    rows, width = flat.shape
    sums, extrema = np.zeros((rows, len(SUMS))), np.full((rows, 2), -np.inf)
    if flat.numel() == 0:
        return sums, extrema
    values = flat if flat.dtype is torch.float32 else flat.float()
    if values.is_cpu:
        shifted = _all_cpu_sums([values])[0]  # (6, rows), shifted by each row's first values (fused.SUMS)
        with np.errstate(all="ignore"):  # NaN and inf stay so; their rows are redone below
            total, squares, absolute, minimum, maximum = fused.unshifted(shifted, width)
    else:  # one transfer per tensor; the sums accumulate in float64 on the device
        wide = torch.float64 if values.device.type != "mps" else torch.float32
        on_device = torch.stack([values.sum(1, dtype=wide),
                                 torch.linalg.vector_norm(values, 2, dim=1, dtype=wide).square(),
                                 torch.linalg.vector_norm(values, 1, dim=1, dtype=wide),
                                 values.amin(1).to(wide), values.amax(1).to(wide)])
        total, squares, absolute, minimum, maximum = on_device.cpu().double().numpy()
    sums[:, 0] = width
    sums[:, 1], sums[:, 2], sums[:, 3] = total, squares, absolute
    extrema[:, 0], extrema[:, 1] = maximum, -minimum
    for row in np.flatnonzero(~np.isfinite(absolute)):  # NaN or inf in the row: count them, extrema without NaN
        values_of_row = values[row]
        nan = torch.isnan(values_of_row)
        sums[row, 4], sums[row, 5] = float(nan.sum()), float(torch.isinf(values_of_row).sum())
        finite_or_inf = values_of_row[~nan]
        if finite_or_inf.numel():
            extrema[row] = float(finite_or_inf.max()), -float(finite_or_inf.min())
        else:
            extrema[row] = -np.inf
    return sums, extrema


def _first_values(local: torch.Tensor, global_shape: tuple[int, ...], offset: tuple[int, ...],
                  kept: int) -> np.ndarray:
    """(local rows, kept) float64: the first ``kept`` values of each row of the whole tensor (in the row-major
    order of its value dimensions) that lie in this rank's box, zero elsewhere."""
    rows = local.shape[0]
    out = np.zeros((rows, kept))
    if not kept or not rows or local.numel() == 0:
        return out
    positions = np.arange(kept)
    value_shape = global_shape[1:]
    if not value_shape:  # one value per row
        out[:, 0] = local.reshape(rows).double().cpu().numpy()
        return out
    coordinates = np.unravel_index(positions, value_shape)
    inside = np.ones(kept, dtype=bool)
    for axis, coordinate in enumerate(coordinates):
        start, size = offset[1 + axis], local.shape[1 + axis]
        inside &= (coordinate >= start) & (coordinate < start + size)
    if not inside.any():
        return out
    index: list[Any] = [slice(None)] + [torch.from_numpy(c[inside] - offset[1 + axis])
                                        for axis, c in enumerate(coordinates)]
    out[:, inside] = local[tuple(index)].double().cpu().numpy().reshape(rows, -1)
    return out
