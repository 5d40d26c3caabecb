"""This process's memory, as the memory benchmarks and tests read it (psutil, which reads /proc on Linux).

RSS counts the pages of the shared libraries too; its anonymous part (RSS less the file-backed and
shared pages: the heaps and the stacks) is where a leak, or an allocator that keeps freed pages, shows.
A support module of the benchmarks and of tests/store/test_writer_memory.py, not of comgra.
"""
from __future__ import annotations

import psutil


def resident_mib() -> float:
    """RSS in MiB."""
    return psutil.Process().memory_info().rss / 2**20


def anonymous_resident_mib() -> float:
    """RSS less the mapped files, in MiB (Linux's RssAnon; psutil has no ``shared`` figure elsewhere)."""
    info = psutil.Process().memory_info()
    return (info.rss - info.shared) / 2**20
