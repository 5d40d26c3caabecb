"""The statistics of whole DTensors from the ranks' local shards, in three packed collectives per recorded step.

Each rank reduces its own shards first (capture/shards.py: per row, additive sums and extrema, and the first
values it holds). At the end of a recorded step that met a DTensor, every rank then makes the same three
all-reduces, whatever the number of sharded tensors, on a gloo process group of comgra's own (made once, at
the first such step, with a timeout of ``COLLECTIVE_TIMEOUT``):

1. a header, MAX over a few int64s: the training step, the number of sharded tensors, a hash of their
   layout (names, kinds, shapes) and a fault flag, each also negated, so that one MAX tells every rank
   whether all ranks agree. Where they do not (a rank's comgra faulted, ranks decided differently which
   tensors to record), every rank leaves the sharded tensors of this step out, the same way, with a warning;
   the buffers below are never reduced with sizes that differ between ranks;
2. SUM over one float64 buffer holding, for every sharded tensor and every row of the whole tensor, the
   counts, sums, sums of squares and of |x|, NaN and inf counts and the first values;
3. MAX over one float64 buffer of the rows' max and -min.

The tensor itself is never gathered: the bytes moved are (rows x (8 + kept neurons)) x 8 per tensor.
comgra's collectives live on their own process group, so they are never matched with a collective of the
training. A rank whose comgra stopped (a fault of comgra's own turns its recording off) no longer comes to
them: the others wait at most ``COLLECTIVE_TIMEOUT`` once, then combine no more (a warning says so), and the
training goes on. The statistics are then exact for float32 values: sums in float64, the variance as
E[x^2] - E[x]^2 (loses digits only where |mean| / std passes about 1e5).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from comgra.capture import shards
from comgra.capture.registry import Registration
from comgra.capture.shards import EXTREMA, SUMS, LocalPart
from comgra.capture.stats import Summary
from comgra.capture.summaries import Block, unsummarisable

COLLECTIVE_TIMEOUT = timedelta(seconds=120)
_HEADER = 9  # step, -step, count, -count, hash high, -hash high, hash low, -hash low, fault


@dataclass
class ShardCombiner:
    """A session's link to the other ranks for sharded tensors: comgra's process group, made at the first step
    that needs it, and why combining is off (None: it is on). ``collectives`` and ``bytes_moved`` count what
    it sent, for benchmarks/fsdp_overhead.py."""

    report: Callable[[str, str], None] | None = None
    off: str | None = None
    group: Any = None
    collectives: int = 0
    bytes_moved: int = 0
    _world: int = field(default=0, init=False)

    @classmethod
    def for_ranks(cls, record_ranks: frozenset[int] | None, report: Callable[[str, str], None] | None) -> ShardCombiner:
        """Off where not every rank records (``record_ranks``): the others could not take part."""
        world = _world_size()
        if world > 1 and record_ranks is not None and not set(range(world)) <= record_ranks:
            return cls(report, off=f"because only ranks {sorted(record_ranks)} of {world} record (record_ranks): "
                                   "combining the shards of a DTensor needs every rank; pass record_ranks='all'")
        return cls(report)

    def combine(self, training_step: int, parts: list[LocalPart], fault: bool) -> list[tuple[LocalPart, np.ndarray, np.ndarray]]:
        """Each part's (rows, 8) statistics and (rows, kept) first values of the whole tensor, in the order of
        the parts; empty where the ranks disagree or combining is off (said once with a warning)."""
        if self.off is not None:
            self._warn("off", f"comgra cannot record the DTensors of this run {self.off}; they are left out.")
            return []
        world = _world_size()
        if world <= 1:  # the local shard is all there is (a mesh of one rank)
            return [] if fault else _finish(parts, *_buffers(parts))[0]
        try:
            group = self._group()
            header = _header(training_step, parts, fault)
            self._all_reduce(header, "MAX", group)
            agreed = all(int(header[i]) == -int(header[i + 1]) for i in range(0, 8, 2)) and int(header[8]) == 0
            if not agreed:
                self._warn(f"disagree:{training_step}",
                           f"comgra left out the DTensors of training step {training_step}: the ranks did not agree on "
                           "them (" + ("a rank's comgra met a fault" if int(header[8]) else
                                       "different steps, tensors or shapes") + "); the rest of the step is recorded.")
                return []
            sums, extrema = _buffers(parts)
            self._all_reduce(sums, "SUM", group)
            self._all_reduce(extrema, "MAX", group)
        except Exception as error:  # noqa: BLE001 - a timeout or a broken peer: never the training's problem
            self.off = f"since a collective of comgra's failed at step {training_step} ({type(error).__name__}: {error})"
            self._warn("failed", f"comgra stops combining DTensor shards across ranks {self.off}; DTensors are left "
                                 "out from now on, everything else is recorded, training goes on.")
            return []
        results, uncovered = _finish(parts, sums, extrema)
        for name in uncovered:
            self._warn(f"uncovered:{name}", f"comgra left out DTensor {name!r}: its shards did not cover each value of "
                                            "the whole tensor exactly once (see the placements); reported once.")
        return results

    def _group(self) -> Any:
        import torch.distributed as dist
        if self.group is None:
            self.group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
        return self.group

    def _all_reduce(self, tensor: torch.Tensor, how: str, group: Any) -> None:
        import torch.distributed as dist
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, how), group=group)
        self.collectives += 1
        self.bytes_moved += tensor.numel() * tensor.element_size()

    def _warn(self, key: str, message: str) -> None:
        if self.report is not None:
            self.report(f"sharded:{key}", message)


@dataclass
class StepShards:
    """This rank's parts of the DTensors of one recorded step, read from the local shards as they come
    (capture/shards.py) and combined across the ranks at the step's end (``blocks``)."""

    combiner: ShardCombiner
    max_neurons: int
    parts: list[LocalPart] = field(default_factory=list)
    fault: bool = False  # reading a shard failed here: told to the other ranks in the header

    def add(self, kind: str, registration: Registration, tensor: Any) -> str:
        """Take this rank's part of ``tensor``: "" where taken, else why not (as ``unsummarisable`` says it). A
        second reading under the same kind (gradient accumulation) replaces the first."""
        reason = shards.unsupported(tensor) or unsummarisable(shards.waited(tensor.to_local()))
        if reason is not None:
            return reason
        self.parts = [p for p in self.parts if (p.kind, p.registration.key) != (kind, registration.key)]
        try:
            self.parts.append(shards.local_part(kind, registration, tensor, self.max_neurons))
        except Exception as error:  # noqa: BLE001 - the other ranks must still hear from this one
            self.fault = True
            return f"because reading its local shard failed ({type(error).__name__}: {error})"
        return ""

    def blocks(self, training_step: int) -> list[Block]:
        """The blocks of the combined DTensors; no collective where this step met none."""
        if not self.parts and not self.fault:
            return []
        return blocks(self.combiner.combine(training_step, self.parts, self.fault))


def _world_size() -> int:
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _header(training_step: int, parts: list[LocalPart], fault: bool) -> torch.Tensor:
    digest = hashlib.blake2b(repr([p.layout() for p in parts]).encode(), digest_size=8).digest()
    high, low = int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little")
    values = [training_step, len(parts), high, low]
    return torch.tensor([v for value in values for v in (value, -value)] + [int(fault)], dtype=torch.int64)


def _buffers(parts: list[LocalPart]) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed SUM buffer (per part: rows x (len(SUMS) + kept)) and MAX buffer (per part: rows x 2), with
    this rank's rows filled in where it owns the values."""
    sums = np.zeros(sum(p.rows * (len(SUMS) + p.kept) for p in parts))
    extrema = np.full(sum(p.rows * len(EXTREMA) for p in parts), -np.inf)
    at_sums = at_extrema = 0
    for part in parts:
        block = sums[at_sums:at_sums + part.rows * (len(SUMS) + part.kept)].reshape(part.rows, -1)
        highs = extrema[at_extrema:at_extrema + part.rows * len(EXTREMA)].reshape(part.rows, -1)
        local_rows = part.sums.shape[0]
        if part.owner and local_rows:
            rows = slice(part.row_offset, part.row_offset + local_rows)
            block[rows, :len(SUMS)] = part.sums
            block[rows, len(SUMS):] = part.neurons
            highs[rows] = part.extrema
        at_sums += block.size
        at_extrema += highs.size
    return torch.from_numpy(sums), torch.from_numpy(extrema)


def _finish(parts: list[LocalPart], sums: torch.Tensor,
            extrema: torch.Tensor) -> tuple[list[tuple[LocalPart, np.ndarray, np.ndarray]], list[str]]:
    """(rows, 8) statistics in the order of stats.STATISTICS and the first values, per part; and the names of
    the parts whose counts show a value counted twice or by no rank (left out)."""
    all_sums, all_extrema = sums.numpy(), extrema.numpy()
    results, uncovered, at_sums, at_extrema = [], [], 0, 0
    for part in parts:
        block = all_sums[at_sums:at_sums + part.rows * (len(SUMS) + part.kept)].reshape(part.rows, -1)
        highs = all_extrema[at_extrema:at_extrema + part.rows * len(EXTREMA)].reshape(part.rows, -1)
        at_sums, at_extrema = at_sums + block.size, at_extrema + highs.size
        count, total, squares, absolute, nan, inf = block[:, :len(SUMS)].T
        if not np.array_equal(count, np.full(part.rows, float(part.width))):
            uncovered.append(part.registration.tensor_name)
            continue
        with np.errstate(all="ignore"):
            mean, abs_mean = total / part.width, absolute / part.width
            std = np.sqrt(np.maximum(squares / part.width - mean * mean, 0.0))
            maximum, minimum = highs[:, 0], -highs[:, 1]
            std[inf > 0] = np.nan  # as the squared deviations from an infinite mean are
            abs_max = np.maximum(-minimum, maximum)
            statistics = np.stack([mean, abs_mean, std, minimum, maximum, abs_max, nan, inf], axis=1)
            statistics[nan > 0, :6] = np.nan  # as torch's reductions propagate NaN
        results.append((part, statistics, block[:, len(SUMS):]))
    return results, uncovered


def blocks(combined: list[tuple[LocalPart, np.ndarray, np.ndarray]]) -> list[Block]:
    """Blocks of the tensors table (capture/summaries.py), one per kind and batch size, from ``combine``."""
    groups: dict[tuple[str, int | None], list[tuple[LocalPart, np.ndarray, np.ndarray]]] = {}
    for item in combined:
        part = item[0]
        groups.setdefault((part.kind, part.rows if part.registration.batch_dim is not None else None), []).append(item)
    result = []
    for (kind, size), items in groups.items():
        per_sample = np.stack([statistics for _, statistics, _ in items], axis=1).astype(np.float32)
        neurons = np.concatenate([first for _, _, first in items], axis=1).astype(np.float32)
        summary = Summary(torch.from_numpy(np.ascontiguousarray(per_sample)), torch.from_numpy(neurons),
                          np.array([p.kept for p, _, _ in items], dtype=np.int64), [p.width for p, _, _ in items])
        result.append(Block(kind, [p.registration for p, _, _ in items], summary, size is not None, None))
    return result
