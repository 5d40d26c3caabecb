"""Spectral norms (the largest singular value) of 2-D parameters and their gradients, on their device: the
Lanczos method, started from the singular vector found at the previous recorded step (CPU), or a fixed
number of steps for all matrices of one shape with no host sync (GPU). Used by ``summaries`` when
``calculate_svd_and_other_expensive_operations_of_parameters`` is on.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Any

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal
from threadpoolctl import ThreadpoolController

from comgra.capture.stats import to_device


def largest_singular_values(matrices: list[torch.Tensor], *, keys: list[object] | None = None,
                            exact_up_to: int = 64, accelerator: bool | None = None) -> torch.Tensor:
    """Spectral norms (largest singular values) of 2-D tensors, on their device.

    The Lanczos method on the smaller Gram matrix A^T A, applied as two matrix-vector products per
    step: a few dozen steps instead of forming the Gram matrix (m n^2) and decomposing it (n^3);
    from a warm start a few steps (measured on the GPT benchmark: 164 ms per recorded step for the
    Gram matrices and ``eigvalsh`` before, 89 ms after). The result stays within 1e-5 of
    ``matrix_norm(ord=2)``.

    * On the CPU each matrix is run to convergence: the residual bound of the top Ritz pair (an
      eigenvalue of A^T A lies within it) below ``RITZ_TOLERANCE`` of the value. ``keys`` (one hashable
      per matrix, e.g. the tensor's name and kind) start each run from the top singular vector found
      for the same key last time: parameters change little between recorded steps, so the start is
      almost converged. A matrix with at most ``exact_up_to`` rows or columns takes ``eigvalsh`` of
      its tiny Gram matrix instead.
    * On a GPU (``accelerator``; tests run it on the CPU) the matrices of one shape are run together
      for a fixed number of steps, and the top eigenvalue of the small tridiagonal matrix is found by
      repeated squaring: a convergence check or ``eigvalsh`` would wait for the device.
    """
    device = matrices[0].device
    if accelerator is None:
        accelerator = device.type != "cpu"
    if not accelerator:
        keys = keys if keys is not None else [None] * len(matrices)
        # The limit costs about 0.3 ms to set and undo: only where a matrix takes the Lanczos steps.
        iterative = any(min(m.shape[-2:]) > exact_up_to for m in matrices)
        with _one_blas_thread() if iterative else contextlib.nullcontext():
            return torch.stack([_spectral_norm_cpu(m.detach().float(), key, exact_up_to)
                                for m, key in zip(matrices, keys)])
    result = torch.empty(len(matrices), device=device)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for index, matrix in enumerate(matrices):
        by_shape.setdefault(tuple(matrix.shape), []).append(index)
    for indices in by_shape.values():
        stack = torch.stack([matrices[i].detach().float() for i in indices])
        result[to_device(torch.tensor(indices), device)] = _lanczos_batched(stack)
    return result


# The top Ritz value is accepted once the residual bound |beta_k s_k| is below this fraction of it. The
# bound limits the eigenvalue's error (sigma squared), so sigma's relative error is at most half of it;
# measured errors are far smaller (about 1e-7), because the true error shrinks with the bound squared.
RITZ_TOLERANCE = 2e-5
MAX_LANCZOS_STEPS = 96
# Below this fraction of its length before reorthogonalisation, a new Lanczos vector is rounding noise.
BREAKDOWN = 1e-4
# Last top singular vector per key (see largest_singular_values); bounded, cleared when full.
_START_VECTORS: dict[object, torch.Tensor] = {}
_MAX_START_VECTORS = 4096
_START_LOCK = threading.Lock()


_BLAS_CONTROLLER: list[ThreadpoolController] = []  # made at the first use (about 50 ms: it scans the loaded libraries)


def _one_blas_thread() -> Any:
    """NumPy's OpenBLAS on one thread while the Lanczos steps run: with its default of one thread per
    core, every matrix-vector product of a 4096x256 matrix wakes a second thread, whose spin-waiting
    cost 17x the CPU time of the work on a busy 2-core machine (measured: 319 ms of process time
    against 18.6 ms with one thread). torch's own threads are the user's setting and stay as they are.
    The limit is process-wide while it lasts (tens of milliseconds)."""
    with _START_LOCK:
        if not _BLAS_CONTROLLER:
            _BLAS_CONTROLLER.append(ThreadpoolController())
    return _BLAS_CONTROLLER[0].limit(limits=1, user_api="blas")


def _spectral_norm_cpu(matrix: torch.Tensor, key: object, exact_up_to: int) -> torch.Tensor:
    a = matrix if matrix.shape[0] >= matrix.shape[1] else matrix.mT  # vectors of the smaller side
    n = a.shape[1]
    if n <= exact_up_to:  # in NumPy: a tenth of torch's fixed cost per call at these sizes
        values = a.detach().numpy().astype(np.float64)
        gram = values.T @ values
        if not np.isfinite(gram).all():  # eigvalsh fails on NaN; matrix_norm gives NaN
            return torch.tensor(float("nan"))
        return torch.tensor(math.sqrt(max(float(np.linalg.eigvalsh(gram)[-1]), 0.0)), dtype=torch.float32)
    with _START_LOCK:
        start = _START_VECTORS.get((key, n)) if key is not None else None
    if start is None:
        start = torch.randn(n, generator=torch.Generator().manual_seed(0))
    value, vector = _lanczos_one(a, start)
    if key is not None and bool(torch.isfinite(vector).all()):
        with _START_LOCK:
            if len(_START_VECTORS) >= _MAX_START_VECTORS:
                _START_VECTORS.clear()
            _START_VECTORS[(key, n)] = vector
    return value


def _lanczos_one(a: torch.Tensor, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigma, top right singular vector) of one (m, n) matrix with m >= n, to RITZ_TOLERANCE.
    Full reorthogonalisation (twice, classical Gram-Schmidt): the basis stays orthonormal, so every
    Ritz value is at most the true top eigenvalue and no ghost copies appear. In NumPy, with only the
    top pair of the tridiagonal matrix from LAPACK (``eigh_tridiagonal``): the vectors are short, so a
    step is a dozen small calls, and NumPy's are a tenth of torch's fixed cost (measured on the GPT
    benchmark's 34 matrices per recorded step: 3x faster than the same steps in torch)."""
    matrix = a.detach().numpy()
    n = matrix.shape[1]
    steps = min(n, MAX_LANCZOS_STEPS)
    basis = np.zeros((steps, n), dtype=np.float32)
    alpha, beta = np.zeros(steps), np.zeros(steps)
    q = start.numpy().astype(np.float32)
    q /= max(float(np.linalg.norm(q)), 1e-30)
    top = 0.0
    ritz: np.ndarray = np.ones(1)
    for j in range(steps):
        basis[j] = q
        w: Any = matrix.T @ (matrix @ q)
        alpha[j] = float(w @ q)
        if not math.isfinite(alpha[j]):  # NaN or inf in the matrix: matrix_norm gives NaN too
            return torch.tensor(float("nan")), torch.full((n,), float("nan"))
        used = basis[:j + 1]
        before = float(np.linalg.norm(w))
        for _ in range(2):
            w -= used.T @ (used @ w)
        beta[j] = float(np.linalg.norm(w))
        if beta[j] <= BREAKDOWN * before:  # the Krylov space is (numerically) invariant: what is left is noise
            beta[j] = 0.0
            w = np.random.default_rng(j).standard_normal((n,), dtype=np.float32)  # go on in a fresh direction
            for _ in range(2):
                w -= used.T @ (used @ w)
        q = w / max(float(np.linalg.norm(w)), 1e-30)
        if j % 2 == 1 or j == steps - 1:
            values, vectors = eigh_tridiagonal(alpha[:j + 1], beta[:j], select="i", select_range=(j, j))
            top, ritz = float(values[-1]), np.asarray(vectors[:, -1])
            residual = float(beta[j] * abs(ritz[-1]))
            if not residual > RITZ_TOLERANCE * top:  # also stops on NaN
                break
    vector = ritz.astype(np.float32) @ basis[:ritz.shape[0]]
    return torch.tensor(math.sqrt(max(top, 0.0)), dtype=torch.float32), torch.from_numpy(vector)


def _tridiagonal(alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    return torch.diag_embed(alpha) + torch.diag_embed(beta, 1) + torch.diag_embed(beta, -1)


GPU_LANCZOS_STEPS = 48


def _lanczos_batched(stack: torch.Tensor, steps: int = GPU_LANCZOS_STEPS) -> torch.Tensor:
    """(S,) sigma of a stack of (m, n) matrices: fixed steps, everything on the device."""
    if stack.shape[1] < stack.shape[2]:
        stack = stack.mT
    count, _, n = stack.shape
    steps = min(n, steps)
    generator = torch.Generator(device=stack.device).manual_seed(0)
    q = torch.randn(count, n, 1, device=stack.device, generator=generator)
    q = q / q.norm(dim=1, keepdim=True)
    basis = torch.zeros(count, n, steps, device=stack.device)
    alpha = torch.zeros(count, steps, device=stack.device)
    beta = torch.zeros(count, steps, device=stack.device)
    for j in range(steps):
        basis[:, :, j:j + 1] = q
        w = stack.mT @ (stack @ q)
        alpha[:, j] = (w * q).sum((1, 2))
        used = basis[:, :, :j + 1]
        before = w.norm(dim=1, keepdim=True)
        for _ in range(2):
            w = w - used @ (used.mT @ w)
        norm = w.norm(dim=1, keepdim=True)  # (S, 1, 1)
        broken = norm <= BREAKDOWN * before  # see _lanczos_one; decided on the device, no host sync
        fresh = torch.randn(w.shape, device=w.device, generator=generator)
        for _ in range(2):
            fresh = fresh - used @ (used.mT @ fresh)
        beta[:, j] = torch.where(broken, 0.0, norm)[:, 0, 0]
        w = torch.where(broken, fresh, w)
        q = w / w.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return _top_eigenvalue_by_squaring(_tridiagonal(alpha, beta[:, :-1])).clamp_min(0).sqrt()


def _top_eigenvalue_by_squaring(matrix: torch.Tensor, squarings: int = 24) -> torch.Tensor:
    """(S,) the largest eigenvalue of symmetric positive semi-definite (S, k, k) matrices without a
    host sync: M^(2^24), scaled by its trace each time, is the projector on the top eigenvector
    (or the top eigenspace, where values tie); its Rayleigh quotient is the eigenvalue."""
    power = matrix
    for _ in range(squarings):
        power = power @ power
        power = power / power.diagonal(dim1=1, dim2=2).sum(1).clamp_min(1e-30)[:, None, None]
    column = power.diagonal(dim1=1, dim2=2).argmax(1)  # the projector's largest column is the best start
    v = power.gather(2, column[:, None, None].expand(-1, power.shape[1], 1))
    return ((v.mT @ matrix @ v) / (v.mT @ v).clamp_min(1e-30))[:, 0, 0]
