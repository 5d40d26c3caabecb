"""Statistics of many tensors at once, on their device, in few kernels and few passes over memory.

Tensors that share a batch size are flattened to ``(B, D_i)``. Small ones are concatenated along
the value dimension and reduced per segment (a fixed number of kernels for all of them); large ones
get one pass over memory each (sum, sum of squares, sum of |.|, min, max), and NaN and inf are
counted only where they can be there. On a GPU nothing reaches the host here: the results move in
the single transfer of the step (``summaries.to_table``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from collections.abc import Callable, Iterable

import numpy as np
import torch
from scipy.linalg import blas

from comgra.capture.fused import ready as _fused_ready
from comgra.capture.fused import finish as _fused_finish
from comgra.capture.fused import many_row_sums as _fused_many_row_sums
from comgra.capture.fused import read_rows as _fused_read_rows

# Order of the statistics in every result; matches comgra.store.format.STATISTICS.
STATISTICS = ("mean", "abs_mean", "std", "min", "max", "abs_max", "nan_count", "inf_count")
BATCH_AGGREGATIONS = ("mean", "std", "abs_max")


@dataclass
class Summary:
    """On-device statistics of one group of tensors with the same batch size B.

    ``per_sample``: (B, S, 8); ``neurons``: (B, sum of kept neurons), ``neuron_slices``
    gives each tensor's part. Without a batch dimension B is 1.
    """

    per_sample: torch.Tensor
    neurons: torch.Tensor
    kept: np.ndarray  # (S,) int64: how many neurons of each tensor ``neurons`` holds, side by side
    sizes: list[int]

    @property
    def neuron_slices(self) -> list[tuple[int, int]]:
        """Each tensor's (start, stop) columns in ``neurons``."""
        ends = np.cumsum(self.kept).tolist()
        return [(end - int(k), end) for end, k in zip(ends, self.kept)]


def summarize(tensors: list[torch.Tensor], *, batch_size: int, max_neurons: list[int]) -> Summary:
    """Statistics over the value dimensions of each ``(B, ...)`` tensor, per sample. A tensor whose batch
    dimension is first may come as it is (``(B, ...)``, or anything with ``batch_size`` 1): it is read as
    ``tensor.view(batch_size, -1)``."""
    summary = _summary_in_the_kernel(tensors, batch_size, max_neurons) if FUSED else None
    if summary is not None:
        return summary
    flats = [_flat(t, batch_size) for t in tensors]
    sizes = [f.shape[1] for f in flats]
    per_sample = _statistics_of_all(flats)
    kept = [min(size, cap) for size, cap in zip(sizes, max_neurons)]
    neurons = _first_values(flats, kept)
    return Summary(per_sample, neurons, np.array(kept, dtype=np.int64), sizes)


def _summary_in_the_kernel(tensors: list[torch.Tensor], rows: int, max_neurons: list[int]) -> Summary | None:
    """The common case on the CPU, float32 tensors with contiguous values: the sums and the first values of
    every tensor in two calls of the kernel, with no view of any tensor (fused.read_rows); the same numbers
    as the path through views, to the bit (the kernel reads the same values in the same order). None where
    the kernel is not there or a tensor is not such."""
    if not tensors[0].is_cpu or not _fused_ready():
        return None
    read = _fused_read_rows(tensors, rows, max_neurons, share=_may_share())
    if read is None:
        return None
    sums, first, sizes = read

    def flat(i: int) -> torch.Tensor:
        return _flat(tensors[i], rows)
    _redo_what_the_kernel_got_wrong(sums, flat)
    per_sample = _statistics_from_sums(sums, np.array(sizes, dtype=np.float64), flat)
    kept = np.minimum(np.array(sizes, dtype=np.int64), np.array(max_neurons, dtype=np.int64))
    return Summary(torch.from_numpy(per_sample), torch.from_numpy(first), kept, sizes)


def _flat(tensor: torch.Tensor, batch_size: int) -> torch.Tensor:
    """(B, D) float32 or wider; a view where it can be (a float32 tensor that is contiguous already
    costs one call instead of three: the summaries of a step flatten a few hundred tensors)."""
    if tensor.dtype is torch.float32 and not tensor.requires_grad and tensor.is_contiguous():
        return tensor.view(batch_size, -1)
    return tensor.detach().reshape(batch_size, -1).float()


def _first_values(flats: list[torch.Tensor], kept: list[int]) -> torch.Tensor:
    """(B, sum of kept): the first ``kept[i]`` values of each row of each flat tensor, side by side. On
    the CPU in NumPy (a slice there costs a tenth of a torch slice, and a step slices hundreds)."""
    if flats[0].device.type != "cpu" or any(f.requires_grad or f.dtype is not torch.float32 for f in flats):
        return torch.cat([f[:, :k] for f, k in zip(flats, kept)], dim=1)
    rows = flats[0].shape[0]
    wanted = [f.numpy()[:, :k] for f, k in zip(flats, kept) if k]
    return torch.from_numpy(np.concatenate(wanted, axis=1) if wanted else np.empty((rows, 0), dtype=np.float32))


# Tensors with fewer elements than this share one segment pass (a fixed number of kernels for all of
# them: BatchNorm and bias parameters, the activations of small nets); larger ones are reduced one by
# one, where a kernel launch is small next to the work (measured: segments win below 2-4K elements
# per tensor, one by one wins 3x at 8K and 10x at 32K).
SEGMENT_BELOW = 4_096
# Elements per chunk of a large tensor on the CPU: a chunk fits a 1 MiB L2 cache, so the passes after the first read it there
# (measured: 128K 15-20% faster than 256K and than 64K per chunk).
CHUNK = 1 << 17


def _statistics_of_all(flats: list[torch.Tensor]) -> torch.Tensor:
    """(B, S, 8) for S flat (B, D_i) tensors: empty ones NaN, small ones in one segment pass, large
    ones one by one (their results finished together)."""
    # With the one-pass kernel on the CPU, small tensors join the large ones: one call of the kernel
    # reads them all (ResNet-18's 62 parameters: one call instead of a segment pass and 21 calls).
    fused_on_cpu = FUSED and flats[0].is_cpu and _fused_ready()
    if fused_on_cpu and all(f.shape[1] for f in flats):  # the usual case: one group, nothing to reorder
        return torch.from_numpy(_cpu_large_statistics(flats))
    groups: dict[str, list[int]] = {"empty": [], "small": [], "large": []}
    small_below = 0 if fused_on_cpu else SEGMENT_BELOW
    for i, f in enumerate(flats):
        groups["empty" if f.shape[1] == 0 else "small" if f.numel() < small_below else "large"].append(i)
    if len(groups["small"]) == 1:  # nothing to share a segment pass with
        groups["large"] += groups.pop("small")
    parts, order = [], []
    for name, members in groups.items():
        if members:
            parts.append(_GROUP_STATISTICS[name]([flats[i] for i in members]))
            order += members
    result = torch.cat(parts, dim=1)
    if order == sorted(order):
        return result
    position = torch.empty(len(order), dtype=torch.long)
    position[torch.tensor(order)] = torch.arange(len(order))
    return result.index_select(1, to_device(position, result.device))


def _empty_statistics(flats: list[torch.Tensor]) -> torch.Tensor:
    rows = flats[0].shape[0]
    nan = torch.full((rows, len(flats), 6), float("nan"), device=flats[0].device)
    return torch.cat([nan, torch.zeros(rows, len(flats), 2, device=nan.device)], dim=2)


def _large_statistics(flats: list[torch.Tensor], *, accelerator: bool | None = None) -> torch.Tensor:
    """Per tensor: sum, sum of squares, sum of |.|, min and max, accumulated in float64; then the
    statistics of all of them. ``accelerator``: the GPU path (default: unless the tensors are on the
    CPU; tests run it on the CPU)."""
    if accelerator is None:
        accelerator = flats[0].device.type != "cpu"
    if not accelerator:
        return torch.from_numpy(_cpu_large_statistics(flats))
    # On a GPU the sums stay on the device, and the statistics of all tensors are a batch of small
    # kernels (their fixed cost paid once per call). Counting NaN and inf on the device every time
    # costs two bandwidth-bound passes; deciding on the host whether to count would wait for the
    # device once per tensor.
    sums = torch.stack([_accelerator_sums(f) for f in flats])
    counts = torch.stack([torch.stack(_nan_and_inf_counts(f)) for f in flats]).to(sums.dtype)
    widths = to_device(torch.tensor([f.shape[1] for f in flats], dtype=sums.dtype), sums.device)[:, None]
    mean, abs_mean = sums[:, 0] / widths, sums[:, 2] / widths
    variance = sums[:, 1] / widths - mean * mean
    return _assemble(mean.float(), abs_mean.float(), variance.clamp_min(0).sqrt().float(), sums[:, 3].float(),
                     sums[:, 4].float(), counts[:, 0].float(), counts[:, 1].float()).transpose(0, 1)


def _cpu_large_statistics(flats: list[torch.Tensor]) -> np.ndarray:
    """(B, S, 8) float32 on the CPU. The sums come from torch chunk by chunk; everything after them is
    NumPy on (S, B) numbers: a torch op costs 5-10 us of dispatch whatever its size, and the twenty
    small ops of finishing cost more than the sums of a 64-value BatchNorm weight (measured on
    ResNet-18: 0.5 ms per call before, a tenth of that after).

    The rare cases get exact work, since reading a flag on the host costs nothing here:
    * NaN and inf are counted only in a tensor whose |.| does not sum to a finite number;
    * where |mean| is large against the std (BatchNorm weights near 1), E[x^2] - E[x]^2 would lose
      digits to cancellation: a second pass sums the squared deviations from the mean."""
    sums = _all_cpu_sums(flats)  # (S, 6, B) float64, shifted (see fused.SUMS)
    return _statistics_from_sums(sums, np.array([f.shape[1] for f in flats], dtype=np.float64), flats.__getitem__)


def _statistics_from_sums(sums: np.ndarray, widths: np.ndarray, flat: Callable[[int], torch.Tensor]) -> np.ndarray:
    """(B, S, 8) float32 from the (S, 6, B) sums of tensors ``widths`` (S,) values wide; ``flat(i)``: tensor i
    as (B, D), wanted only for the rare tensors (NaN, inf, or a variance that cancels)."""
    finished = _fused_finish(sums, widths) if FUSED else None
    if finished is None:
        return _finish_on_host([flat(i) for i in range(len(widths))], sums, widths[:, None])
    result, rare = finished  # the common case in one call of the kernel; the rare tensors as below
    if len(rare):
        result[:, rare] = _finish_on_host([flat(i) for i in rare], sums[rare], widths[rare, None])
    return result


def _finish_on_host(flats: list[torch.Tensor], sums: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """(B, S, 8) float32 from the (S, 6, B) sums in NumPy, with the exact work of the rare cases (see
    ``_cpu_large_statistics``); ``fused.finish`` does the same arithmetic in one call where no rare case is."""
    counts = np.zeros((len(flats), 2, sums.shape[2]))
    with np.errstate(all="ignore"):
        shifted_mean = sums[:, 0] / widths
        mean, abs_mean = sums[:, 5] + shifted_mean, sums[:, 2] / widths
        variance = sums[:, 1] / widths - shifted_mean * shifted_mean
        finite = np.isfinite(sums[:, 2]).all(1)
        conditioned = (np.isfinite(variance) & (variance * 3 >= shifted_mean * shifted_mean)).all(1)
        for i in np.flatnonzero(~finite):
            counts[i] = torch.stack(_nan_and_inf_counts(flats[i])).numpy()
        for i in np.flatnonzero(~conditioned):  # also where a row holds NaN or inf: the pass gives NumPy's NaN
            variance[i] = _square_deviations_on_cpu(flats[i], mean[i]) / widths[i]
        std = np.sqrt(np.maximum(variance, 0.0))  # NaN stays NaN
    return _assemble_on_host(mean, abs_mean, std, sums[:, 3], sums[:, 4], counts[:, 0], counts[:, 1])


def _assemble_on_host(*statistics: np.ndarray) -> np.ndarray:
    """(B, S, 8) float32 from seven (S, B) arrays in the order of STATISTICS less abs_max."""
    mean, abs_mean, std, minimum, maximum, nan_count, inf_count = statistics
    abs_max = np.maximum(-minimum, maximum)  # NaN stays NaN, as in |x|.max()
    stacked = np.stack([mean, abs_mean, std, minimum, maximum, abs_max, nan_count, inf_count], axis=-1)
    return np.ascontiguousarray(stacked.astype(np.float32).transpose(1, 0, 2))


# The one-pass kernel of capture/fused.py for tensors above SUMS_ON_HOST_UP_TO (tests switch it off to
# reach the chunked path).
FUSED = True

# A tensor with at most this many values gets its sums from NumPy in float64 directly: five NumPy ops
# on a small array cost a few microseconds, five torch ops 30-50 (dispatch).
SUMS_ON_HOST_UP_TO = 8_192


def _all_cpu_sums(flats: list[torch.Tensor]) -> np.ndarray:
    """(S, 6, B) float64 in the order of fused.SUMS: one call of the one-pass kernel for all the tensors
    (capture/fused.py); the eager path for each tensor it cannot read, where it is not built, and for
    rows with NaN or inf (their sum of |.| is not finite), whose min and max the kernel's comparisons
    would get wrong."""
    fused = _fused_many_row_sums(flats, share=_may_share()) if FUSED else None
    if fused is None:
        return np.stack([_cpu_sums(f) for f in flats])
    sums, skipped = fused
    _redo_what_the_kernel_got_wrong(sums, flats.__getitem__, skipped)
    return sums


def _may_share() -> bool:
    """Whether the kernel's call may be shared with a helper thread, where COMGRA_KERNEL_HELPER=1 asks for it
    (capture/fused.py): only where the caller waits (the training thread), never on comgra's own worker,
    which runs beside the training."""
    return not threading.current_thread().name.startswith("comgra-")


def _redo_what_the_kernel_got_wrong(sums: np.ndarray, flat: Callable[[int], torch.Tensor],
                                    skipped: Iterable[int] = ()) -> None:
    """The eager sums, in place, of the tensors the kernel skipped and of those with a sum that is not
    finite: not only |.|, as the shifted sums of finite values near float32's limit can overflow where |.|
    does not; and the kernel's comparisons skip NaN, so its min and max would be wrong."""
    for i in set(skipped) | set(np.flatnonzero(~np.isfinite(sums[:, :3]).all((1, 2))).tolist()):
        sums[i] = _cpu_sums(flat(i))


def _cpu_sums(values: torch.Tensor) -> np.ndarray:
    """(6, B) in float64 for one (B, D) tensor, in the order of fused.SUMS, without the kernel (which
    ``_all_cpu_sums`` tries first): chunk by chunk (each chunk stays in the cache, read four times),
    never a temporary larger than a chunk, with a shift of 0. Measured on ResNet-18's parameters, one core:
    the kernel 3.5 ms, the chunks 13-16 ms; the chunks are 25% faster than centring every chunk on its
    mean, 10x faster than ``torch.var_mean`` (Welford, not vectorised), than float64 accumulation and
    than ``linalg.vector_norm(x, 1)``."""
    rows, width = values.shape
    if values.numel() <= SUMS_ON_HOST_UP_TO:
        wide = values.detach().numpy().astype(np.float64)
        with np.errstate(all="ignore"):  # inf - inf in a sum: NaN, as in torch
            return np.stack([wide.sum(1), np.einsum("ij,ij->i", wide, wide), np.abs(wide).sum(1),
                             wide.min(1), wide.max(1), np.zeros(rows)])
    step = max(1, CHUNK // rows)
    chunks = np.stack([_chunk_sums(values[:, start:start + step]) for start in range(0, width, step)])
    with np.errstate(all="ignore"):
        return np.concatenate([chunks[:, :3].sum(0), chunks[:, 3:4].min(0), chunks[:, 4:].max(0),
                               np.zeros((1, rows))])  # NaN stays NaN


def _chunk_sums(chunk: torch.Tensor) -> np.ndarray:
    """(5, B) float64: sum, sum of squares, sum of |.|, min and max of each row of a (B, n) float32
    chunk. The sum of squares and of |.| come from BLAS (``sdot``, ``sasum``: one read each, no
    temporary), which is 2x faster per chunk than torch's dot and ``abs`` into a buffer then ``sum``
    (measured per 128K values, one core: 69 us against 143 us for all five); ``linalg.vector_norm(x, 1)``
    is 10x slower still."""
    rows = chunk.numpy()
    if chunk.shape[0] == 1:  # one row: aminmax over the flat data is the fastest min and max
        minimum, maximum = torch.aminmax(chunk.reshape(-1))
        row = rows[0]
        return np.array([[float(chunk.sum())], [blas.sdot(row, row)], [blas.sasum(row)], [float(minimum)],
                         [float(maximum)]])
    squares = [blas.sdot(row, row) for row in rows]
    absolute = [blas.sasum(row) for row in rows]
    return np.stack([chunk.sum(1).numpy().astype(np.float64), np.array(squares), np.array(absolute),
                     chunk.amin(1).numpy().astype(np.float64),  # aminmax(dim): 40x slower
                     chunk.amax(1).numpy().astype(np.float64)])


def _square_deviations_on_cpu(values: torch.Tensor, mean: np.ndarray) -> np.ndarray:
    """(B,) float64: the sum of squared deviations of each row from ``mean`` (B,), in NumPy where the
    tensor is small (see SUMS_ON_HOST_UP_TO)."""
    if values.numel() <= SUMS_ON_HOST_UP_TO:
        deviation = values.detach().numpy().astype(np.float64) - mean[:, None]
        return np.einsum("ij,ij->i", deviation, deviation)
    return _square_deviations(values, torch.from_numpy(mean.astype(np.float32))).numpy()


def _square_deviations(values: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """(B,): the sum of squared deviations from ``mean`` of each row, chunk by chunk, in float64."""
    rows, width = values.shape
    step = max(1, CHUNK // rows)
    scratch = _scratch(rows * min(step, width))
    total = torch.zeros(rows, dtype=torch.float64)
    for start in range(0, width, step):
        chunk = values[:, start:start + step]
        buffer = scratch[:chunk.numel()].view(chunk.shape)
        torch.sub(chunk, mean[:, None], out=buffer)
        total += torch.linalg.vector_norm(buffer, 2, dim=1).double().square()
    return total


_SCRATCH = threading.local()


def _scratch(size: int) -> torch.Tensor:
    """A float32 buffer of at least ``size`` elements, kept per thread: a fresh one for every tensor
    would be a fresh mapping from the OS, and its page faults cost more than the arithmetic."""
    buffer = getattr(_SCRATCH, "buffer", None)
    if buffer is None or buffer.numel() < size:
        buffer = _SCRATCH.buffer = torch.empty(max(size, 1))
    return buffer


def _accelerator_sums(values: torch.Tensor) -> torch.Tensor:
    """(5, B) on a GPU: reductions that accumulate in float64 inside the kernel (no copy). The float64
    sums make E[x^2] - E[x]^2 exact enough for float32 data, so no host check is needed."""
    wide = wide_dtype(values.device)
    return torch.stack([values.sum(1, dtype=wide), torch.linalg.vector_norm(values, 2, dim=1, dtype=wide).square(),
                        torch.linalg.vector_norm(values, 1, dim=1, dtype=wide),
                        values.amin(1).to(wide), values.amax(1).to(wide)])


def wide_dtype(device: torch.device) -> torch.dtype:
    """float64 for sums, except on Apple's MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def _nan_and_inf_counts(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.isnan(values).sum(1), torch.isinf(values).sum(1)


def _assemble(mean: torch.Tensor, abs_mean: torch.Tensor, std: torch.Tensor, minimum: torch.Tensor,
              maximum: torch.Tensor, nan_count: torch.Tensor, inf_count: torch.Tensor) -> torch.Tensor:
    """Stacks the statistics along the last dimension, in the order of STATISTICS."""
    abs_max = torch.maximum(-minimum, maximum)  # NaN stays NaN, as in |x|.max()
    return torch.stack([mean, abs_mean, std, minimum, maximum, abs_max, nan_count, inf_count], dim=-1)


def _segment_statistics(flats: list[torch.Tensor]) -> torch.Tensor:
    """(B, S, 8) for many small (B, D_i) tensors: concatenated along the values in float64 (small by
    construction) and reduced per segment with ``segment_reduce`` (about 20x faster on the CPU than
    ``scatter_reduce`` and than reducing a transposed copy with ``index_add_``). Two-pass variance."""
    data = torch.cat(flats, dim=1)
    rows, device = data.shape[0], data.device
    data = data.to(wide_dtype(device))
    sizes = [f.shape[1] for f in flats]
    # Built on the host and sent without waiting: no device sync; unsafe=True skips the validation
    # of the lengths, which reads them back to the host.
    lengths = to_device(torch.tensor(sizes).expand(rows, -1).contiguous(), device)
    segment_of = to_device(torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)), device)
    widths = to_device(torch.tensor(sizes, dtype=data.dtype), device)

    def reduce(x: torch.Tensor, how: str) -> torch.Tensor:
        return torch.segment_reduce(x, how, lengths=lengths, axis=1, unsafe=True)

    mean = reduce(data, "sum") / widths
    deviation = data - mean.index_select(1, segment_of)
    variance = reduce(deviation * deviation, "sum") / widths
    abs_mean = reduce(data.abs(), "sum") / widths
    if device.type != "cpu" or not bool(torch.isfinite(abs_mean).all()):  # see _large_statistics
        nan_count, inf_count = (reduce(f(data).to(data.dtype), "sum") for f in (torch.isnan, torch.isinf))
    else:
        nan_count = inf_count = torch.zeros_like(mean)
    stats = [mean, abs_mean, variance.sqrt(), reduce(data, "min"), reduce(data, "max"), nan_count, inf_count]
    return _assemble(*(s.float() for s in stats))


def _segment_statistics_on_host(flats: list[torch.Tensor]) -> torch.Tensor:
    """The CPU twin of ``_segment_statistics`` in NumPy: ``reduceat`` reduces every segment in one
    call, and NumPy's per-call cost is a tenth of torch's, which dominates at these sizes."""
    data = np.concatenate([f.detach().numpy() for f in flats], axis=1).astype(np.float64)
    sizes = np.array([f.shape[1] for f in flats])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    with np.errstate(all="ignore"):
        mean = np.add.reduceat(data, starts, axis=1) / sizes
        deviation = data - np.repeat(mean, sizes, axis=1)
        std = np.sqrt(np.add.reduceat(deviation * deviation, starts, axis=1) / sizes)
        abs_mean = np.add.reduceat(np.abs(data), starts, axis=1) / sizes
        if np.isfinite(abs_mean).all():
            nan_count = inf_count = np.zeros_like(mean)
        else:
            nan_count, inf_count = (np.add.reduceat(f(data), starts, axis=1, dtype=np.int64) for f in (np.isnan, np.isinf))
        statistics = [mean, abs_mean, std, np.minimum.reduceat(data, starts, axis=1),
                      np.maximum.reduceat(data, starts, axis=1), nan_count, inf_count]
    return torch.from_numpy(_assemble_on_host(*(np.asarray(x, dtype=np.float64).T for x in statistics)))


def _small_statistics(flats: list[torch.Tensor]) -> torch.Tensor:
    return (_segment_statistics_on_host if flats[0].device.type == "cpu" else _segment_statistics)(flats)


_GROUP_STATISTICS = {"empty": _empty_statistics, "small": _small_statistics, "large": _large_statistics}


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device`` without a host sync (a no-op on the CPU)."""
    return tensor if tensor.device == device else tensor.to(device, non_blocking=True)


def batch_aggregates(x: torch.Tensor) -> torch.Tensor:
    """Mean, population std and max |.| over the batch (dim 0): shape (3, *x.shape[1:])."""
    mean = x.mean(0)
    deviation = x - mean
    std = (deviation * deviation).mean(0).sqrt()  # two passes: 7-15x faster than torch.std on the CPU
    return torch.stack([mean, std, x.abs().amax(0)])
