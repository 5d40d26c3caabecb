"""``comgra``'s server hands glibc's free-but-kept memory back (``comgra.server.heap``, issue 31 item 13): in a served
live run that memory, not what was allocated, carried the RSS up."""
from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from comgra.server import heap

BLOCK = 64 * 1024  # under glibc's mmap threshold: from the heap


def _fragmented_heap_probe(trim: bool) -> float:
    """MiB of RSS a fresh process gets back after freeing 48 MiB of heap blocks while the last stays allocated
    (glibc gives back only the top of the heap by itself), with or without one ``HeapTrimmer.trim``."""
    code = f"""
import ctypes, psutil
from comgra.server.heap import HeapTrimmer
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc({BLOCK}) for _ in range(768)]
for block in blocks:
    ctypes.memset(block, 1, {BLOCK})
before = psutil.Process().memory_info().rss
for block in blocks[:-1]:
    libc.free(block)
if {trim}:
    HeapTrimmer().trim()
print((before - psutil.Process().memory_info().rss) / 2**20)
"""
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_trim_hands_back_the_free_memory_glibc_keeps():
    kept = _fragmented_heap_probe(trim=False)
    given_back = _fragmented_heap_probe(trim=True)
    assert kept < 8 and given_back > 40, (kept, given_back)


def test_the_trimmer_counts_its_calls_and_their_cpu():
    trimmer = heap.HeapTrimmer(every=3600)
    if not trimmer.available:
        pytest.skip("not glibc")
    trimmer.trim()
    trimmer.trim()
    assert trimmer.trims == 2 and trimmer.cpu_seconds >= 0


class FakeLibc:
    def __init__(self, calls: list[tuple[int, int]]):
        self.mallopt = lambda parameter, value: calls.append((parameter, value)) or 1
        self.malloc_trim = lambda pad: 1


def test_the_mmap_threshold_is_fixed_unless_the_user_set_it(monkeypatch):
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeLibc(calls))
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert heap.fix_mmap_threshold() is True and calls == [(-3, heap.MMAP_THRESHOLD_BYTES)]  # M_MMAP_THRESHOLD
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert heap.fix_mmap_threshold() is False and len(calls) == 1


def test_without_glibc_nothing_is_done(monkeypatch):
    def no_library(name: object) -> None:
        raise OSError("no libc")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    assert heap.keep_heap_small() is None and heap.fix_mmap_threshold() is False


def test_comgra_serves_with_the_trimmer(recording):
    """The served process: its glibc heap is trimmed (a thread of the server calls it; counted here through the
    module's trimmer after a start)."""
    code = f"""
import threading, sys
from comgra.cli import app as cli
from comgra.server import heap
started = []
real = heap.keep_heap_small
heap.keep_heap_small = lambda *a, **k: started.append(real(*a, **k)) or started[-1]
cli._run_server = lambda *a, **k: 0  # everything up to serving
cli.main(["--path", {str(recording)!r}, "--port", "0"])
names = [t.name for t in threading.enumerate()]
print(bool(started) and "comgra-heap-trim" in names)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.stdout.strip().endswith("True"), out.stdout + out.stderr
