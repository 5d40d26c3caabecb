"""This process's memory, as the memory benchmarks and tests read it (psutil, which reads /proc on Linux).

RSS counts the pages of the shared libraries too; its anonymous part (RSS less the file-backed and
shared pages: the heaps and the stacks) is where a leak, or an allocator that keeps freed pages, shows.
A support module of the benchmarks and of tests/store/test_writer_memory.py, not of comgra.
"""
from __future__ import annotations

import ctypes
from typing import Any

import psutil


def resident_mib() -> float:
    """RSS in MiB."""
    return psutil.Process().memory_info().rss / 2**20


def anonymous_resident_mib() -> float:
    """RSS less the mapped files, in MiB (Linux's RssAnon; psutil has no ``shared`` figure elsewhere)."""
    info = psutil.Process().memory_info()
    return (info.rss - info.shared) / 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo2() -> Any:
    """glibc's ``mallinfo2`` (2.33 and later; it sums every thread's arena), or None elsewhere."""
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


_MALLINFO2 = _mallinfo2()


def native_heap_mib() -> dict[str, float]:
    """glibc's heap: bytes in use (small blocks and mmapped ones) and bytes free but kept; {} off glibc.

    Free-but-kept growing while in-use stays put is fragmentation; both growing is a native leak."""
    if _MALLINFO2 is None:
        return {}
    info = _MALLINFO2()
    return {"malloc_used": (info.uordblks + info.hblkhd) / 2**20, "malloc_free": info.fordblks / 2**20,
            "malloc_mapped": info.hblkhd / 2**20}


def pymalloc_mib() -> dict[str, float]:
    """Python's own allocator (``sys._debugmallocstats``, which writes to the C stderr): its arenas (1 MiB each, all
    resident once touched) against the bytes in live blocks; arenas growing while blocks do not is fragmentation."""
    import os
    import re
    import sys
    import tempfile

    with tempfile.TemporaryFile(mode="w+") as captured:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(captured.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read()

    def number(label: str) -> float:
        found = re.search(re.escape(label) + r"\s*=\s*([0-9,]+)", text)
        return float(found.group(1).replace(",", "")) if found else float("nan")

    return {"py_arenas": number("# arenas allocated current"),
            "py_arenas_most": number("# arenas highwater mark"),
            "py_in_blocks": number("# bytes in allocated blocks") / 2**20,
            "py_free_blocks": number("# bytes in available blocks") / 2**20,
            "py_free_pools": number("unused pools * 16384 bytes") / 2**20 if "unused pools" in text else float("nan")}
