"""One pass over memory for the sums of a tensor's statistics, in a small C kernel.

torch has no single kernel for the sum, the sum of squares, the sum of |.|, the minimum and the
maximum, so the eager path reads every value four times (measured on ResNet-18's 11.2M parameter
values, one core: 13-16 ms eager, 3.5 ms here; on the 2.4M values of its largest tensor 0.44 ms).
``many_row_sums`` sums all the tensors of a step in one call (ResNet-18: one call for 62 parameters
instead of 21 calls and a NumPy segment pass for the small ones).

The kernel is compiled with the system's C compiler the first time it is wanted, on a thread of its
own (about 0.3 s of CPU once), into a per-user cache that the next processes load in a millisecond.
Until it is ready, and wherever there is no compiler, the compile fails or the kernel's self-test
disagrees with NumPy, ``row_sums`` answers None and the caller takes the eager path: the kernel is a
speed-up, never a requirement. ``COMGRA_FUSED_KERNEL=0`` switches it off.

Exactness: each of 16 lanes sums at most 64 values in float32 before adding to float64 totals (the
error of a float32 sum of 64 values, far below float32 rounding of the result). The sums are of
``x - k``, with ``k`` the mean of the row's first 16 values, so that the variance
``E[(x-k)^2] - E[x-k]^2`` does not cancel where |mean| is large against the std (the caller still
checks, and sums squared deviations in a second pass where it would). min and max are exact in any
order, except that comparisons skip NaN: a row with NaN or inf has a non-finite sum of |.|, and the
caller recomputes such rows (NaN and inf counts, and min and max, with torch).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import itertools
import os
import platform
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from comgra import native_build
from comgra.capture.fused_source import SOURCE  # a name of this module: tests replace it (see _new_build)

_LOCK = threading.Lock()  # the helper thread's executor


# The kernel's six numbers per row, in order (see SOURCE): shifted by ``shift``, the mean of the row's
# first 16 values, so that the variance needs no second pass where |mean| is large against the std.
SUMS = ("shifted_sum", "shifted_square_sum", "abs_sum", "min", "max", "shift")


def row_sums(values: torch.Tensor) -> np.ndarray | None:
    """(6, B) float64 in the order of SUMS for each row of a (B, D) float32 CPU tensor whose rows are
    contiguous; None while the kernel is not (or cannot be) there."""
    result = many_row_sums([values])
    return None if result is None or result[1] else result[0][0]


# From this many values on, a call is shared with a helper thread: the sums are bound by memory
# bandwidth, and a second core reads at about the same speed again (ResNet-18's 11.2M gradient values:
# 4.0 ms on one core, 2.3 ms on two, measured with the training thread waiting for them).
# Off by default; ``COMGRA_KERNEL_HELPER=1`` switches it on. Measured side by side with the original on
# ResNet-18 (benchmarks/recorder_overhead.py, 4 rounds, a busy 2-core machine): with the helper the
# training thread's CPU per recorded step was 23.7 ms and the process's 42.4 ms, without it 11.7 and
# 32.1 ms, the wall time the same within the noise (40.8 and 43.7 ms). Where torch uses every core, as
# a user's torch does by default, there is no idle core for the helper to take.
SHARE_FROM = 1 << 20
_HELPER: dict[str, Any] = {"executor": None, "pid": 0}


def many_row_sums(tensors: list[torch.Tensor], *, share: bool = False) -> tuple[np.ndarray, list[int]] | None:
    """(S, 6, B) float64 for S (B, D_i) tensors of the same B, in one call of the kernel, and the
    indices of the tensors it could not read (their rows are NaN: the caller takes the eager path for
    them); None while the kernel is not (or cannot be) there. ctypes releases the GIL during the call.
    ``share``: above SHARE_FROM values, a helper thread reads about half of them meanwhile (for a
    caller that waits for the result; never from a thread that should leave the other cores alone)."""
    kernel = _kernel()
    if kernel is None or not tensors or _is_compiling():
        return None
    rows = tensors[0].shape[0] if tensors[0].dim() == 2 else 0
    pointers, widths, strides, index, skipped = [], [], [], [], []
    for i, values in enumerate(tensors):
        pointer = values.data_ptr() if _readable(values, rows) else 0
        if pointer:
            pointers.append(pointer)
            widths.append(values.shape[1])
            strides.append(values.stride(0))
            index.append(i)
        else:
            skipped.append(i)
    if not skipped:  # the usual case: the kernel writes the result itself
        out = np.empty((len(tensors), 6, rows))
        _shared_call(kernel[1], pointers, widths, strides, rows, out, share)
        return out, skipped
    out = np.full((len(tensors), 6, rows), np.nan)
    if index:
        done = np.empty((len(index), 6, rows))
        _shared_call(kernel[1], pointers, widths, strides, rows, done, share)
        out[index] = done
    return out, skipped


def _shared_call(function: Any, pointers: list[int], widths: list[int], strides: list[int], rows: int,
                 done: np.ndarray, share: bool) -> None:
    """The kernel on all the tensors into ``done``; ``share``: with a helper thread reading about half of
    them, where COMGRA_KERNEL_HELPER=1 asks for it and there are SHARE_FROM values or more."""
    # Held in names for the call: ``.ctypes.data`` is a bare address, which does not keep its array alive.
    arguments = [np.array(a, dtype=np.int64) for a in (pointers, widths, strides)]
    if share:
        sizes = np.cumsum(arguments[1]) * rows
        share = sizes[-1] >= SHARE_FROM and os.environ.get("COMGRA_KERNEL_HELPER", "0") == "1"
    cut = int(np.searchsorted(sizes, sizes[-1] / 2)) + 1 if share else 0
    cut = cut if 0 < cut < len(pointers) else 0
    helper = _helper().submit(_call, function, arguments, rows, done, 0, cut) if cut else None
    try:
        _call(function, arguments, rows, done, cut, len(pointers))
    finally:  # never leave the helper writing into ``done`` or reading tensors after they are gone
        if helper is not None:
            helper.result()


def _call(function: Any, arguments: list[np.ndarray], rows: int, done: np.ndarray, start: int, end: int) -> None:
    """The kernel on tensors [start, end) of a call, into their part of ``done`` (the parts are disjoint)."""
    if end > start:
        pointers, widths, strides = arguments
        function(end - start, pointers[start:].ctypes.data, rows, widths[start:].ctypes.data,
                 strides[start:].ctypes.data, done[start:].ctypes.data)


def read_rows(tensors: list[torch.Tensor], rows: int, caps: list[int], *,
              share: bool = False) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
    """``many_row_sums`` and the first values of each row without a view of any tensor: each tensor, read as
    ``rows`` rows of its contiguous float32 values (what ``tensor.view(rows, -1)`` would show), gives its
    (6, rows) sums; the first ``min(width, cap)`` values of each row are copied side by side into one
    (rows, total) float32 array. Returns the (S, 6, rows) sums, that array and the widths; None where the
    kernel is not there or a tensor is not such (the caller takes the path through views).

    A step of ResNet-18 summarises 150 tensors: each view costs a tensor object (a few microseconds, and
    objects that the garbage collector counts), and a NumPy slice per tensor for its first values costs as
    much again; here it is two calls for all of them."""
    kernel = _kernel()
    if kernel is None or not tensors or rows <= 0 or _is_compiling():
        return None
    pointers, widths = [], []
    for values in tensors:
        if not _reads(values):
            return None
        count = values.numel()
        pointer = values.data_ptr() if count and not count % rows and values.is_contiguous() else 0
        if not pointer:
            return None
        pointers.append(pointer)
        widths.append(count // rows)
    sums = np.empty((len(tensors), 6, rows))
    _shared_call(kernel[1], pointers, widths, widths, rows, sums, share)
    kept = np.minimum(np.array(widths, dtype=np.int64), np.array(caps, dtype=np.int64))
    total = int(kept.sum())
    first = np.empty((rows, total), dtype=np.float32)
    if total:
        addresses, strides = np.array(pointers, dtype=np.int64), np.array(widths, dtype=np.int64)
        kernel[3](len(tensors), addresses.ctypes.data, rows, strides.ctypes.data, kept.ctypes.data, total,
                  first.ctypes.data)
    return sums, first, widths


def finish(sums: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(B, S, 8) float32 statistics in the order of stats.STATISTICS from ``many_row_sums``' (S, 6, B) sums
    of tensors ``widths`` (S,) values wide, and the indices of the tensors left for the caller's exact path
    (their part of the result is not written: a sum of |x| that is not finite, or a variance that
    cancels); None while the kernel is not there. One call instead of the twenty NumPy calls of the
    finishing in stats.py, with the same arithmetic, so the same values to the bit (tests/capture/test_fused.py);
    a step of ResNet-18 finishes six groups of tensors, each 50-250 us in NumPy."""
    kernel = _kernel()
    if kernel is None or _is_compiling():
        return None
    count, _, rows = sums.shape
    sums = np.ascontiguousarray(sums, dtype=np.float64)
    widths = np.ascontiguousarray(widths, dtype=np.float64)
    out = np.empty((rows, count, 8), dtype=np.float32)
    flags = np.empty(count, dtype=np.int8)
    kernel[2](count, rows, widths.ctypes.data, sums.ctypes.data, out.ctypes.data, flags.ctypes.data)
    return out, np.flatnonzero(flags)


def wide_sums(tensors: list[torch.Tensor]) -> np.ndarray | None:
    """(S, 2) float64: the sum and the sum of squares of each tensor's values, every value widened to float64 before
    it is added (as exact as torch's float64 reductions), in one call of the kernel for all of them; None while the
    kernel is not there or a tensor is not contiguous float32 values in the CPU's memory (the caller reduces in
    torch). The fingerprints of capture/evidence.py: one pass over memory instead of a float64 copy per tensor."""
    kernel = _kernel()
    if kernel is None or not tensors or _is_compiling():
        return None
    pointers, sizes = [], []
    for values in tensors:
        if not _reads(values) or not values.is_contiguous():
            return None
        count = values.numel()
        pointer = values.data_ptr() if count else 0
        if count and not pointer:
            return None
        pointers.append(pointer)
        sizes.append(count)
    addresses, counts = np.array(pointers, dtype=np.int64), np.array(sizes, dtype=np.int64)
    out = np.empty((len(tensors), 2))
    kernel[4](len(tensors), addresses.ctypes.data, counts.ctypes.data, out.ctypes.data)
    return out


# The sentinels' reductions in the kernel up to this many values (integers; floats up to EXTREMES_FLOAT_UP_TO): a torch
# call costs 1-2 us of dispatch hot (5-20 in a training loop; the sentinels take five: aminmax, vector_norm, three
# reads), the kernel's loop about 0.6 ns per value (floats in 16 lanes, integers one at a time), torch's vectorised
# floats about 0.3 ns for the two passes. Measured hot, one thread, one tensor per call (benchmarks/sentinel_kernel.py):
# 4,096 floats kernel 5.9 us, torch 4.4; 16,384 12.9 and 8.1; 65,536 40.8 and 19.8; integers, which torch first casts,
# the kernel at every size (65,536: 41.0 against 61.6). Floats up to 16,384: where the kernel's extra loop time stays
# below the dispatch of torch's five calls in a training step; beyond, torch at finish_batch.
EXTREMES_UP_TO = 1 << 16
EXTREMES_FLOAT_UP_TO = 1 << 14
_KINDS = {torch.float32: 0, torch.float64: 1, torch.int64: 2, torch.int32: 3, torch.uint8: 4, torch.bool: 4,
          torch.int8: 5, torch.int16: 6}


def extremes(values: torch.Tensor) -> tuple[float, float, float] | None:
    """(min, max, L2 norm) of a CPU tensor's values in float64, NaN min and max where a value is NaN (as
    ``torch.aminmax``), in one call of the kernel; None where ``extremes_spec`` refuses the tensor (the caller reduces
    in torch)."""
    spec = extremes_spec(values)
    if spec is None:
        return None
    out = _THREE()
    _BUILD.value[5](*spec, out)
    low, high, squares = out
    return low, high, squares ** 0.5


def extremes_spec(values: torch.Tensor) -> tuple[int, int, int] | None:
    """(address, number of values, kind) of a tensor the sentinels' kernel can read (``many_extremes``), or None where
    the kernel is not there, the tensor is larger than EXTREMES_UP_TO (floats: EXTREMES_FLOAT_UP_TO), empty, not
    contiguous, not plainly in the CPU's memory, or of another type (the caller reduces in torch). Attribute reads
    only: no torch operation."""
    kind = _KINDS.get(values.dtype)
    if kind is None or _BUILD.value is None and _kernel() is None:
        return None
    count = values.numel()
    if not 0 < count <= (EXTREMES_FLOAT_UP_TO if kind < 2 else EXTREMES_UP_TO):
        return None
    subclass = type(values)  # then ``_reads`` less the dtype, inline: values of its own in the CPU's memory, dense
    if not ((subclass is torch.Tensor or subclass is torch.nn.Parameter or subclass.__torch_dispatch__ is _NO_DISPATCH)
            and values.is_cpu and values.layout is torch.strided and not values.is_neg() and not values.is_nested
            and not _is_functional(values) and not _is_functorch_wrapped(values) and values.is_contiguous()) \
            or _is_compiling():
        return None
    pointer = values.data_ptr()
    return (pointer, count, kind) if pointer else None


def many_extremes(specs: list[tuple[int, int, int]]) -> list[list[float]]:
    """[min, max, sum of squares] in float64 of each tensor of ``extremes_spec``'s specs, in one call of the kernel
    (NaN min and max where a value is NaN). The tensors must still be alive: the caller holds them."""
    count = len(specs)
    if not count:
        return []
    # ctypes arrays, not NumPy's: a step's few specs cost 1 us this way, 3 us through np.array, empty and tolist
    out = (ctypes.c_double * (3 * count))()
    _BUILD.value[6](count, (ctypes.c_int64 * (3 * count))(*itertools.chain.from_iterable(specs)), out)
    found = iter(out)
    return [[low, high, squares] for low, high, squares in zip(found, found, found)]


_THREE = ctypes.c_double * 3


def _helper() -> concurrent.futures.ThreadPoolExecutor:
    """One helper thread per process, made at the first shared call (a forked child makes its own)."""
    with _LOCK:
        if _HELPER["executor"] is None or _HELPER["pid"] != os.getpid():
            _HELPER.update(executor=concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="comgra-kernel"),
                           pid=os.getpid())
        return _HELPER["executor"]


def ready() -> bool:
    """Whether the kernel is loaded (the first call loads a cached build or starts one)."""
    return _kernel() is not None


def _reads(values: torch.Tensor) -> bool:
    """Whether the kernel may read ``values``' memory at all: a plain tensor or a subclass without __torch_dispatch__
    (a DTensor, a FakeTensor or a FunctionalTensor has no memory of its own there, or someone else's), float32 in the CPU's memory, dense,
    with no lazy negation, not a wrapper of functionalization or torch.func (vmap, grad), whose pointer is null
    or whose ``data_ptr()`` raises. The callers also refuse a null pointer. A few attribute reads per tensor."""
    # is_cpu, not device.type: a step checks a hundred tensors, and making a device object costs 0.4 us.
    kind = type(values)
    return ((kind is torch.Tensor or kind is torch.nn.Parameter or kind.__torch_dispatch__ is _NO_DISPATCH)
            and values.dtype is torch.float32 and values.is_cpu
            and values.layout is torch.strided and not values.is_neg() and not values.is_nested
            and not _is_functional(values) and not _is_functorch_wrapped(values))


_NO_DISPATCH = torch._C._disabled_torch_dispatch_impl  # a subclass without __torch_dispatch__ holds its own values
_is_functional = torch._is_functional_tensor
_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
# True while TorchDynamo traces (torch.compile): a constant in the traced code, so that the kernel's calls are
# never part of a traced frame (recorder.py keeps comgra's entry points out of traced frames; this is the last guard).
_is_compiling = torch.compiler.is_dynamo_compiling  # one call (is_compiling also asks TorchScript: two)


def _readable(values: torch.Tensor, rows: int) -> bool:
    """What the kernel reads: float32 rows of contiguous values in the CPU's memory, nothing lazy."""
    if not _reads(values):
        return False
    shape = values.shape
    return len(shape) == 2 and shape[0] == rows > 0 and shape[1] > 0 and (shape[1] == 1 or values.stride(1) == 1)


def _kernel() -> Any:
    """The loaded functions, or None; the first call loads a cached build or starts one."""
    return _BUILD.value if _BUILD.value is not None else _BUILD.get()


def ensure_built(timeout: float = 120.0) -> bool:
    """Build (or load) the kernel now and wait for it; True if it is usable. For tests and benchmarks."""
    return _BUILD.ensure_built(timeout)


def _compiler() -> str | None:
    return native_build.find_compiler("CC", ("cc", "gcc", "clang"))


# No contraction into fused multiply-adds: finish() must give NumPy's results to the bit. The flags are part of
# the cache key, so a change of them builds anew.
BUILD_FLAGS = ("-O3", "-ffp-contract=off", "-shared", "-fPIC")


def _library_path() -> Path | None:
    """Where this source, built by this compiler for this platform, lives in the cache."""
    compiler = _compiler()
    if compiler is None or sys.platform == "win32":
        return None
    return native_build.cached_library("row_sums", [SOURCE, *BUILD_FLAGS, compiler, platform.machine(), sys.platform],
                                       ".so")


def _compile(library: Path) -> None:
    native_build.compile_atomically(
        library, SOURCE, "row_sums.c",
        lambda source, target: [str(_compiler()), *BUILD_FLAGS, "-o", str(target), str(source), "-lm"], timeout=120)


def _load(library: Path) -> tuple[Any, ...] | None:
    """Load the library and check it against NumPy on values with every case the kernel meets (a tail
    shorter than the lanes, several rows with a stride, negative and positive values, a second tensor)."""
    try:
        loaded = ctypes.CDLL(str(library))
        single, many, finish = loaded.comgra_row_sums, loaded.comgra_many_row_sums, loaded.comgra_finish
        first, wide, ends = loaded.comgra_first_values, loaded.comgra_wide_sums, loaded.comgra_extremes
        # The sentinels' calls read a few KiB: they keep the GIL (PyDLL). A call that lets it go waits to take it back,
        # up to the switch interval (5 ms) while the writer thread encodes a recorded step's tables.
        held = ctypes.PyDLL(str(library))
        ends, all_ends = held.comgra_extremes, held.comgra_many_extremes
        single.restype = many.restype = finish.restype = first.restype = wide.restype = ends.restype = None
        all_ends.restype = None
        all_ends.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        ends.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        wide.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        first.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_long, ctypes.c_void_p]
        finish.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p]
        single.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
        many.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_void_p]
        probe = torch.from_numpy(np.random.default_rng(0).standard_normal((3, 2_500)).astype(np.float32))[:, :2_345]
        second = probe[:, 7:40] + 5.0
        out = np.empty((2, 6, 3))
        arguments = [np.array(a, dtype=np.int64) for a in ([probe.data_ptr(), second.data_ptr()], [2_345, 33],
                                                            [2_500, 33])]
        many(2, arguments[0].ctypes.data, 3, arguments[1].ctypes.data, arguments[2].ctypes.data, out.ctypes.data)
        alone = np.empty((6, 3))
        single(probe.data_ptr(), 3, 2_345, probe.stride(0), alone.ctypes.data)
        for sums, tensor in ((out[0], probe), (out[1], second), (alone, probe)):
            if not np.allclose(unshifted(sums, tensor.shape[1]), reference_sums(tensor.numpy()), rtol=1e-6, atol=1e-4):
                raise OSError("the kernel disagrees with NumPy")
        kept = np.array([5, 3], dtype=np.int64)
        values = np.empty((3, 8), dtype=np.float32)
        first(2, arguments[0].ctypes.data, 3, arguments[2].ctypes.data, kept.ctypes.data, 8, values.ctypes.data)
        if not np.array_equal(values, np.concatenate([probe.numpy()[:, :5], second.numpy()[:, :3]], axis=1)):
            raise OSError("the kernel's first values disagree with NumPy")
        sizes, wide_out = np.array([probe.numel() - 3, 0], dtype=np.int64), np.empty((2, 2))
        flat = torch.from_numpy(np.random.default_rng(1).standard_normal(probe.numel()).astype(np.float32))
        wide(2, np.array([flat.data_ptr(), 0], dtype=np.int64).ctypes.data, sizes.ctypes.data, wide_out.ctypes.data)
        reference = flat.numpy()[:-3].astype(np.float64)
        if not np.allclose(wide_out, [[reference.sum(), reference @ reference], [0.0, 0.0]], rtol=1e-12, atol=1e-9):
            raise OSError("the kernel's float64 sums disagree with NumPy")
        samples = [flat[:100], flat[:100].double(), (flat[:100] * 100).long(), torch.tensor([3.0, float("nan"), 1.0]),
                   flat[:37] - 9.0, torch.tensor([-float("inf")] * 19), torch.tensor([float("inf")] * 3)]
        specs = [(sample.data_ptr(), sample.numel(), _KINDS[sample.dtype]) for sample in samples]
        many_out = np.empty((len(samples), 3))
        all_ends(len(samples), np.array(specs, dtype=np.int64).ctypes.data, many_out.ctypes.data)
        for sample, spec, together in zip(samples, specs, many_out):
            three = _THREE()
            ends(*spec, three)
            wanted = [float(sample.min()), float(sample.max()), float(sample.double().pow(2).sum())]
            if not (np.allclose(list(three), wanted, rtol=1e-12, equal_nan=True)
                    and np.allclose(together, wanted, rtol=1e-12, equal_nan=True)):
                raise OSError("the kernel's extremes disagree with torch")
        return single, many, finish, first, wide, ends, all_ends
    except (OSError, AttributeError):
        return None


def unshifted(sums: np.ndarray, width: int) -> np.ndarray:
    """(5, B): the sum, sum of squares, sum of |.|, min and max from the kernel's (6, B) shifted sums."""
    shifted, squares, absolute, minimum, maximum, shift = sums
    total = shifted + width * shift
    return np.stack([total, squares + 2 * shift * shifted + width * shift * shift, absolute, minimum, maximum])


def reference_sums(values: np.ndarray) -> np.ndarray:
    """(5, B): the same five sums of a (B, D) array in NumPy's float64."""
    wide = values.astype(np.float64)
    return np.stack([wide.sum(1), (wide * wide).sum(1), np.abs(wide).sum(1), wide.min(1), wide.max(1)])


def _new_build() -> native_build.LazyBuild:
    # Late-bound lambdas: tests replace _compiler and SOURCE to see a failing or a wrong build refused.
    return native_build.LazyBuild(thread_name="comgra-kernel-build", switch="COMGRA_FUSED_KERNEL",
                                  library_path=lambda: _library_path(), build=lambda path: _compile(path),
                                  load=lambda path: _load(path))


_BUILD = _new_build()
