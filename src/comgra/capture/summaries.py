"""From registered tensors to rows of the ``tensors`` table, with one host transfer per step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from comgra.capture import fused
from comgra.capture.registry import Registration
from comgra.capture.spectral import largest_singular_values
from comgra.capture.stats import Summary, batch_aggregates, summarize, to_device
from comgra.store import format as fmt


@dataclass
class Block:
    """Statistics of several tensors of one kind that share a batch size, still on the device."""

    kind: str  # "forward" or a gradient group
    registrations: list[Registration]
    summary: Summary
    has_batch: bool
    svd: torch.Tensor | None  # (S,) NaN where not computed
    # Registration keys whose rows are not written: a later record_current_gradients call of the same group in
    # the same step recorded their gradients again (capture/gradients.py).
    superseded: set[tuple[int, str]] = field(default_factory=set)


def summarize_values(kind: str, items: list[tuple[Registration, torch.Tensor]], *,
                     max_neurons: int, with_svd: bool) -> list[Block]:
    """Group by (device, batch size) and summarise each group in a few kernels.

    A tensor whose batch dimension is first, or that has none, is handed on as it is (``summarize`` reads
    it as (B, ...) or (1, ...)): a step summarises about 150 tensors, and a view of each (a detached
    tensor, then its batch-first shape) made two tensor objects per tensor for the garbage collector to
    count, about a third of what a recorded step allocated."""
    groups: dict[tuple[Any, int | None], tuple[list[Registration], list[torch.Tensor]]] = {}
    complex_values: dict[tuple[int, str], torch.Tensor] = {}  # their singular values are those of z, not of |z|
    for registration, value in items:
        batch_dim = registration.batch_dim
        if value.is_complex():  # recorded as magnitudes |z| (README, "Complex tensors"); the kernels read real values
            complex_values[registration.key] = value
            value = value.detach().abs()
        if batch_dim:  # detached first: a view of a parameter would otherwise get an autograd node of its own
            value = registration.batch_first(value.detach())
        if value.is_neg():  # a lazy negation (torch._neg_view, the imaginary part of a conjugate): NumPy cannot read it
            value = value.detach().resolve_neg()
        size = value.shape[0] if batch_dim is not None else None
        # is_cpu first: making a device object costs more than the rest of this loop's body
        key = ("cpu" if value.is_cpu else value.device, size)
        group = groups.get(key)
        if group is None:
            group = groups[key] = ([], [])
        group[0].append(registration)
        group[1].append(value)
    blocks = []
    for (_, size), (registrations, values) in groups.items():
        summary = summarize(values, batch_size=1 if size is None else size,
                            max_neurons=[neuron_cap(kind, r, max_neurons) for r in registrations])
        blocks.append(Block(kind, registrations, summary, size is not None, _svd(kind, registrations, values, with_svd,
                                                                             complex_values)))
    return blocks


# An image-shaped tensor, (N, C, H, W) with C of 1 or 3, keeps every value of each recorded sample up to this many
# (3x64x64: 48 KiB of float32 per sample and recorded step), so that the app's Images tab can draw it (TensorBoard's
# Images). Larger images keep max_num_neurons_to_record values as any tensor does (raise it to C*H*W to draw them).
IMAGE_VALUES = 3 * 64 * 64


def image_shaped(shape: tuple[int, ...] | None, batch_dim: int | None) -> bool:
    """(N, C, H, W) with the batch first and C of 1 (grey) or 3 (RGB)."""
    return shape is not None and batch_dim == 0 and len(shape) == 4 and shape[1] in (1, 3) and shape[2] >= 2 and shape[3] >= 2


def neuron_cap(kind: str, registration: Registration, max_neurons: int) -> int:
    """How many values of each sample of ``registration`` to keep: none for a KPI-only tensor, a whole image of an
    image-shaped value (not its gradient) up to IMAGE_VALUES, ``max_neurons`` otherwise (0 keeps none at all)."""
    if registration.recording_type in ("kpis", "kpis_and_svd"):
        return 0
    if max_neurons and kind == fmt.FORWARD and image_shaped(registration.shape, registration.batch_dim):
        whole = registration.shape[1] * registration.shape[2] * registration.shape[3]
        if whole <= IMAGE_VALUES:
            return max(max_neurons, whole)
    return max_neurons


def unsummarisable(tensor: torch.Tensor) -> str | None:
    """Why comgra cannot summarise ``tensor``'s values, as the end of a sentence, or None where it can.

    comgra summarises dense real tensors of ``torch.Tensor``, ``nn.Parameter`` and their subclasses without a
    ``__torch_dispatch__`` of their own, on any device and with any strides. Anything else is left out with a warning (capture/step.py) rather than reaching a kernel that
    cannot read it (the C kernel of capture/fused.py would read a null or foreign pointer: SIGSEGV) or a
    conversion that would record a wrong number (a DTensor's local shard under the whole tensor's name). A complex
    tensor is summarised as its magnitudes |z| (``summarize_values``; ``complex_notice`` says so). Checked for each
    tensor of a recorded step: a few attribute reads."""
    kind = type(tensor)
    if ((kind is torch.Tensor or kind is torch.nn.Parameter or kind.__torch_dispatch__ is _NO_DISPATCH)
            and tensor.layout is torch.strided
            and not tensor.is_quantized and not tensor.is_meta and not tensor.is_nested
            and not _is_functional(tensor) and not _is_functorch_wrapped(tensor)):
        return None
    return _reason(tensor)


# A subclass without __torch_dispatch__ (a Parameter subclass of a library, ``as_subclass`` for a tag) holds its own
# values like a tensor; one with it (DTensor, FakeTensor, FunctionalTensor, the jagged NestedTensor, Float8 tensors)
# stands for values held elsewhere, or none.
_NO_DISPATCH = torch._C._disabled_torch_dispatch_impl
_is_functional = torch._is_functional_tensor  # functionalization's wrapper (torch.compile, torch.export)
_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor  # inside torch.func.vmap, grad, ...


def _reason(tensor: torch.Tensor) -> str:
    kind = type(tensor)
    if kind.__name__ == "DTensor":
        return ("because it is a DTensor (FSDP2's fully_shard, tensor parallelism) and no recorder session combines "
                "its shards across ranks here (capture/sharded.py does in a recorded step): the shard's statistics "
                "under the whole tensor's name would be wrong")
    if kind.__name__ in ("FakeTensor", "FunctionalTensor"):
        return f"because it is a {kind.__name__} of a graph being traced (torch.compile, torch.export): it has no values"
    if kind.__torch_dispatch__ is not _NO_DISPATCH:
        return (f"because it is a {kind.__module__}.{kind.__qualname__}, a tensor subclass with its own "
                "__torch_dispatch__, whose values comgra does not read")
    if tensor.layout is not torch.strided:
        return f"because its layout is {tensor.layout}; register tensor.to_dense() to record it"
    if tensor.is_quantized:
        return f"because it is quantized ({tensor.dtype}); register tensor.dequantize() to record it"
    if tensor.is_meta:
        return "because it is on the meta device: it has no values"
    if tensor.is_nested:
        return "because it is a nested tensor"
    return ("because it is a wrapper of torch.func (vmap, grad) or of functionalization, with no values of its own "
            "(register it outside the transformed function)")


def _with_complex_norms(wanted: list[tuple[int, Registration]], real: list[tuple[int, Registration]],
                        norms: torch.Tensor | None, complex_values: dict[tuple[int, str], torch.Tensor]) -> torch.Tensor:
    """The norms of ``wanted`` in order: those of ``real`` from ``norms``, the complex ones from matrix_norm."""
    of_real = dict(zip([i for i, _ in real], norms.unbind() if norms is not None else ()))
    return torch.stack([of_real[i] if i in of_real else torch.linalg.matrix_norm(
        complex_values[r.key].detach().reshape(r.shape), ord=2).float() for i, r in wanted])


def complex_notice(tensor_name: str, dtype: torch.dtype) -> str:
    """What a user is told, once per tensor name, when a complex tensor is recorded: never a silent cast."""
    return (f"Tensor {tensor_name!r} is complex ({dtype}): comgra records its magnitudes |z| (every statistic, "
            "mean, abs_mean, std, min, max, abs_max, and the first values, for the values and the gradients) and not "
            f"its phase. To record the real and imaginary parts, register torch.view_as_real(...) of it (or .real and "
            ".imag under two names). This warning is given once per tensor name.")


def _svd(kind: str, registrations: list[Registration], values: list[torch.Tensor], with_svd: bool,
         complex_values: dict[tuple[int, str], torch.Tensor]) -> torch.Tensor | None:
    wanted = [(i, r) for i, r in enumerate(registrations)
              if r.batch_dim is None and len(r.shape) == 2
              and ((with_svd and r.tensor_type == "parameter") or r.recording_type == "kpis_and_svd")]
    if not wanted:
        return None
    device = values[0].device
    real = [(i, r) for i, r in wanted if r.key not in complex_values]
    # Keyed by name and kind: the next recorded step of the same tensor starts from this one's vector.
    of_real = largest_singular_values([values[i].detach().reshape(r.shape) for i, r in real],
                                      keys=[(kind, r.tensor_name, r.iteration) for _, r in real]) if real else None
    # a complex matrix (rare): its exact spectral norm, in place of |z|'s
    norms = of_real if len(real) == len(wanted) else _with_complex_norms(wanted, real, of_real, complex_values)
    assert norms is not None
    if device.type == "cpu":  # in NumPy: three torch calls here cost more than the norms of small matrices
        on_host = np.full(len(values), np.nan, dtype=np.float32)
        on_host[[i for i, _ in wanted]] = norms.numpy()
        return torch.from_numpy(on_host)
    result = torch.full((len(values),), float("nan"), device=device)
    result[to_device(torch.tensor([i for i, _ in wanted]), device)] = norms
    return result


def prepare() -> None:
    """Pay the one-time costs of the first recorded step when the recorder starts, before the training
    loop: pyarrow imports pandas at its first conversion of any value (about 0.4 s of CPU, measured in
    the first recorded step of the ResNet-18 benchmark: 1.0 s of CPU against 0.15 s for later steps),
    and the one-pass statistics kernel is loaded from its cache or its build begins (capture/fused.py)."""
    try:
        pa.array([0])
        fused.row_sums(torch.zeros(1, 1))
    except Exception:  # noqa: BLE001 - a head start only; the first step pays it then
        pass


@dataclass
class SampleChoice:
    """Which samples of the batch get rows of their own, and their categories."""

    indices: list[int]
    categories: list[str] | None = None


def to_table(training_step: int, blocks: list[Block], choice: SampleChoice) -> pa.Table:
    """Move every block to the host in one transfer and build the rows."""
    if not blocks:
        return pa.table({})
    on_host = all(block.summary.per_sample.device.type == "cpu" for block in blocks)
    arrays = _arrays_on_host(blocks, choice) if on_host else _arrays_in_one_transfer(blocks, choice)
    return _rows(training_step, [_BlockRows(block, choice, *parts) for block, parts in zip(blocks, arrays)])


Arrays = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]  # a block's statistics rows, neurons rows, svd


def _arrays_in_one_transfer(blocks: list[Block], choice: SampleChoice) -> list[Arrays]:
    """From a device: the batch aggregates and the chosen samples computed there, all in one transfer."""
    parts, shapes = [], []
    for block in blocks:
        for tensor in _block_parts(block, choice):
            parts.append(tensor.reshape(-1))
            shapes.append(tensor.shape)
    flat = torch.cat(parts).cpu().numpy()
    arrays, offset = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        arrays.append(flat[offset:offset + size].reshape(shape))
        offset += size
    result, position = [], 0
    for block in blocks:
        svd = arrays[position + 2] if block.svd is not None else None
        result.append((arrays[position], arrays[position + 1], svd))
        position += 2 if svd is None else 3
    return result


def _arrays_on_host(blocks: list[Block], choice: SampleChoice) -> list[Arrays]:
    """The same from CPU tensors, in NumPy: nothing to transfer, and the dozen small ops per block
    cost a fifth of torch's (whose per-call dispatch dominates at these sizes)."""
    index = np.asarray(choice.indices, dtype=np.int64)
    result: list[Arrays] = []
    for block in blocks:
        stats, neurons = block.summary.per_sample.numpy(), block.summary.neurons.numpy()
        if block.has_batch:
            stats = np.concatenate([_batch_aggregates_on_host(stats), stats[index]])
            neurons = np.concatenate([_batch_aggregates_on_host(neurons), neurons[index]])
        result.append((stats, neurons, None if block.svd is None else block.svd.numpy()))
    return result


def _batch_aggregates_on_host(x: np.ndarray) -> np.ndarray:
    """``stats.batch_aggregates`` in NumPy: mean, population std and max |.| over dim 0."""
    with np.errstate(all="ignore"):  # inf - inf and NaN give NaN, as in torch
        mean = x.mean(0)
        deviation = x - mean
        return np.stack([mean, np.sqrt((deviation * deviation).mean(0)), np.abs(x).max(0)]).astype(x.dtype, copy=False)


def _block_parts(block: Block, choice: SampleChoice) -> list[torch.Tensor]:
    per_sample, neurons = block.summary.per_sample, block.summary.neurons
    if block.has_batch:
        index = to_device(torch.tensor(choice.indices, dtype=torch.long), per_sample.device)
        per_sample = torch.cat([batch_aggregates(per_sample), per_sample.index_select(0, index)])
        neurons = torch.cat([batch_aggregates(neurons), neurons.index_select(0, index)])
    parts = [per_sample, neurons]
    if block.svd is not None:
        parts.append(block.svd)
    return parts


class _BlockRows:
    """The rows of one block as NumPy arrays and small lists, row-major (rows x tensors), before they
    join the other blocks' in one Arrow table."""

    def __init__(self, block: Block, choice: SampleChoice, stats: np.ndarray, neurons: np.ndarray,
                 svd: np.ndarray | None) -> None:
        self.block, self.stats, self.neurons = block, stats, neurons
        n_rows, n_tensors = stats.shape[0], len(block.registrations)
        if block.has_batch:
            self.aggregation = ["mean", "std", "abs_max"] + ["sample"] * len(choice.indices)
            self.sample = [-1, -1, -1] + list(choice.indices)
            self.category = [None] * 3 + (list(choice.categories) if choice.categories else [None] * len(choice.indices))
        else:
            self.aggregation, self.sample, self.category = ["none"], [-1], [None]
        self.svd = (np.tile(svd, n_rows).astype(np.float32) if svd is not None
                    else np.full(n_rows * n_tensors, np.nan, dtype=np.float32))
        self.kept = np.tile(block.summary.kept, n_rows)
        per_sample = np.array([r.per_sample for r in block.registrations], dtype=bool)
        keep = (np.array(self.aggregation) != "sample")[:, None] | per_sample[None, :]
        if block.superseded:
            keep &= np.array([r.key not in block.superseded for r in block.registrations], dtype=bool)[None, :]
        self.keep = keep.reshape(-1)


def _rows(training_step: int, pieces: list[_BlockRows]) -> pa.Table:
    """The rows of every block in one table. What names the rows (tensor, node, role, kind, sample,
    shape, ...) is the same at every recorded step of a fixed network: it is built once per layout
    (``_layout``) and reused, so that a step builds only its numbers (measured on ResNet-18: 1.6 ms per
    step with the names built every time)."""
    key = _layout_key(pieces)
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _layout(pieces)
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    columns, offsets, keep = layout
    columns = dict(columns)
    count = len(offsets) - 1
    columns["training_step"] = pa.array(np.full(count, training_step, dtype=np.int64))
    flat_stats = np.concatenate([piece.stats.reshape(-1, piece.stats.shape[-1]) for piece in pieces])
    for i, name in enumerate(("mean", "abs_mean", "std", "min", "max", "abs_max", "nan_count", "inf_count")):
        columns[name] = flat_stats[:, i].astype(np.float32)
    columns["svd_max"] = np.concatenate([piece.svd for piece in pieces])
    neuron_values = np.concatenate([piece.neurons.reshape(-1) for piece in pieces]).astype(np.float32, copy=False)
    columns["neurons"] = pa.ListArray.from_arrays(offsets, pa.array(neuron_values, pa.float32()))
    table = pa.table({name: columns[name] for name in fmt.TENSORS_SCHEMA.names}, schema=fmt.TENSORS_SCHEMA)
    return table if keep is None else table.filter(keep)


# Row layouts by everything they are built from (_layout_key), shared by the steps of a process;
# cleared when full, as a network whose layout changes every step would grow it without end.
_LAYOUTS: dict[tuple[Any, ...], tuple[dict[str, Any], pa.Array, pa.Array | None]] = {}
_MAX_LAYOUTS = 64


def _layout_key(pieces: list[_BlockRows]) -> tuple[Any, ...]:
    return tuple((piece.block.kind, piece.stats.shape[0], tuple(piece.aggregation), tuple(piece.sample),
                  tuple(piece.category), tuple(piece.block.summary.sizes), tuple(piece.kept.tolist()),
                  tuple((r.tensor_name, r.iteration, r.node, r.role, r.tensor_type, r.shape, r.per_sample)
                        for r in piece.block.registrations), frozenset(piece.block.superseded)) for piece in pieces)


def _layout(pieces: list[_BlockRows]) -> tuple[dict[str, Any], pa.Array, pa.Array | None]:
    """The naming columns of the rows, the neurons' list offsets and the rows to keep (None: all).

    Each per-tensor and per-row column is made once as an Arrow array over all blocks and repeated
    with ``take``, so that no Python list grows with rows x tensors."""
    regs = [r for piece in pieces for r in piece.block.registrations]
    kinds = [piece.block.kind for piece in pieces for _ in piece.block.registrations]
    tensor_index, row_index, tensor_offset, row_offset = [], [], 0, 0
    for piece in pieces:
        n_rows, n_tensors = piece.stats.shape[0], len(piece.block.registrations)
        tensor_index.append(np.tile(np.arange(tensor_offset, tensor_offset + n_tensors, dtype=np.int32), n_rows))
        row_index.append(np.repeat(np.arange(row_offset, row_offset + n_rows, dtype=np.int32), n_tensors))
        tensor_offset, row_offset = tensor_offset + n_tensors, row_offset + n_rows
    per_tensor, per_row = pa.array(np.concatenate(tensor_index)), pa.array(np.concatenate(row_index))
    fields = {name: fmt.TENSORS_SCHEMA.field(name).type for name in fmt.TENSORS_SCHEMA.names}
    columns: dict[str, Any] = {}
    per_tensor_values: tuple[tuple[str, list[Any]], ...] = (
        ("kind", kinds), ("iteration", [r.iteration for r in regs]), ("node", [r.node for r in regs]),
        ("role", [r.role for r in regs]), ("tensor_name", [r.tensor_name for r in regs]),
        ("tensor_type", [r.tensor_type for r in regs]), ("shape", [list(r.shape) for r in regs]))
    for name, values in per_tensor_values:
        columns[name] = pa.array(values, fields[name]).take(per_tensor)
    for name in ("aggregation", "sample", "category"):
        columns[name] = pa.array([v for piece in pieces for v in getattr(piece, name)], fields[name]).take(per_row)
    columns["num_neurons"] = pa.array(np.concatenate([np.tile(np.asarray(piece.block.summary.sizes, dtype=np.int64),
                                                              piece.stats.shape[0]) for piece in pieces]))
    offsets = np.concatenate([[0], np.cumsum(np.concatenate([piece.kept for piece in pieces]))]).astype(np.int32)
    keep = np.concatenate([piece.keep for piece in pieces])
    return columns, pa.array(offsets), None if keep.all() else pa.array(keep)
