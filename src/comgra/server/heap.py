"""glibc's heap in ``comgra``'s own server process: freed memory handed back (issue 31 item 13).

Measured in a served live run (``benchmarks/server_hours.py``, 20 REST clients, 10 minutes): what the server's
allocations held stayed nearly flat (glibc's memory in use 44 -> 48 MiB, Python's blocks and DuckDB's and Arrow's
counts flat), while glibc's free-but-kept memory grew 22 -> 38 MiB and carried the RSS with it. The answers of a
live run grow with it (the steps list, a series: hundreds of kilobytes), and glibc, once a block that large is
freed, raises its mmap threshold to the block's size: from then on such blocks come from the heap, and the free
space they leave between live blocks stays resident. Two things give it back:

* the mmap threshold is fixed (``MMAP_THRESHOLD_BYTES``): a block that large is always its own mapping, and goes
  back to the system when freed (glibc then also stops raising its trim threshold);
* ``malloc_trim(0)`` every ``TRIM_EVERY_S`` seconds, from a thread of its own: it hands back every whole free page
  of every arena (glibc's own trim gives back only the top of the main heap). It holds an arena's lock while it
  walks its free blocks: about a millisecond per call (``HeapTrimmer.cpu_seconds`` counts it).

Measured over 20 minutes (docs/performance.md, round five): glibc's free-but-kept memory fell from 40 to 16 MiB,
but the RSS slope without the findings scan did not (+1.79 and +1.72 against +1.20 and +1.43 MiB per minute for the
tree before, two runs): the pages given back are taken again by the next answers.

Only ``comgra``'s own server process does this (``comgra PATH``, ``comgra demo``); a notebook's app runs in the
user's process and leaves its allocator alone. Elsewhere than glibc nothing is done.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any

TRIM_EVERY_S = 30.0
# glibc's default starts at 128 KiB and rises up to 32 MiB as blocks are freed. 256 KiB until round six: a live
# run's answers build arrays of a value per step (the KPIs' downsampling, a series: 8 bytes a step), which pass
# through 64-256 KiB as the run grows; below the threshold they come from the thread arena (8 minutes side by side:
# its resident pages 11 -> 13 MiB at 256 KiB, flat at 7.6-8.4 at 64; RSS slope +1.07 against +0.75 MiB/min, the
# intervals overlapping; docs/performance.md). Blocks of 64 KiB and more then cost a mapping each (no fewer requests
# were answered).
MMAP_THRESHOLD_BYTES = 64 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim, libc.mallopt  # noqa: B018 - glibc's names: elsewhere (musl, macOS) one is missing
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def fix_mmap_threshold(size: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Blocks of ``size`` bytes and more always get a mapping of their own (see the module); False off glibc, and
    where the user set glibc's ``MALLOC_MMAP_THRESHOLD_`` (theirs wins)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    libc = _libc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, int(size)))


class HeapTrimmer:
    """A thread that calls glibc's ``malloc_trim(0)`` every ``every`` seconds until ``stop``; counts the calls and
    the CPU time they took."""

    def __init__(self, every: float = TRIM_EVERY_S) -> None:
        self.every = every
        self.trims = 0
        self.cpu_seconds = 0.0
        self._trim = getattr(_libc(), "malloc_trim", None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="comgra-heap-trim", daemon=True)

    @property
    def available(self) -> bool:
        """Whether there is a glibc to trim."""
        return self._trim is not None

    def start(self) -> HeapTrimmer:
        if self.available:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def trim(self) -> None:
        """One ``malloc_trim(0)`` now (on this thread), counted."""
        if self._trim is None:
            return
        began = time.thread_time()
        self._trim(0)
        self.cpu_seconds += time.thread_time() - began
        self.trims += 1

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.trim()
            except Exception:  # noqa: BLE001 - a fault here must never stop the server
                return


def keep_heap_small(every: float = TRIM_EVERY_S) -> HeapTrimmer | None:
    """Fix glibc's mmap threshold and start trimming its heap every ``every`` seconds; None off glibc."""
    trimmer = HeapTrimmer(every)
    if not trimmer.available:
        return None
    fix_mmap_threshold()
    return trimmer.start()
