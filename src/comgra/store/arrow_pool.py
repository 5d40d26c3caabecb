"""Arrow's memory pool in ``comgra``'s own server process (issue 31 item 13).

pyarrow's wheels take Arrow's buffers from mimalloc. mimalloc keeps the pages a thread frees in that
thread's heap; the server answers every request on a new thread (Werkzeug), so the pages of the chunks
requests read stayed behind in heaps of threads that had ended. Under REST clients and a live run, the
1 GiB mapping mimalloc reserves held about half of what the server had gained after 10 minutes (116 MiB
with the background scan, while Arrow's own count was 31 MiB; 33 MiB without it, Arrow's count 1.2 MiB;
``benchmarks/server_hours.py`` prints both each minute). jemalloc's arenas are shared by all threads
and hand freed pages back after a short decay, so the server takes Arrow's buffers from it, or from
glibc's malloc (its arenas limited by ``limit_malloc_arenas``) where pyarrow has no jemalloc. jemalloc's
decay is set to 0: pages freed go back to the OS at once rather than after a second (with DuckDB's allocator
flushed past 4 MB, ``store/duck_connection.py``: 20 minutes, no findings scan, +2.45 -> +1.71 MiB per minute,
docs/performance.md). The slope is lower, not level.
"""
from __future__ import annotations

import importlib
import os
import sys

POOL = "jemalloc"


def use_arrow_pool_that_gives_back() -> str | None:
    """Make jemalloc (else the system allocator) Arrow's pool in this process; returns its name, or None where the
    user's ``ARROW_DEFAULT_MEMORY_POOL`` says otherwise.

    Called first thing when ``comgra`` serves, before pyarrow is imported: Arrow's C++ code takes its pool
    from ``ARROW_DEFAULT_MEMORY_POOL`` once, when pyarrow loads, and the setting is taken out of the
    environment again at once, so that no child process inherits it (the findings scan's child is given the same
    pool by ``start_child``). Where pyarrow is loaded already, the pool pyarrow's own calls use is set (parts of
    Arrow's C++ code then still use mimalloc). A notebook's app runs in the user's process and never calls this:
    its pool is the user's."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return None
    return _choose(POOL)


def _choose(name: str) -> str:
    if "pyarrow" not in sys.modules:
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = name
        try:
            import pyarrow as pa

            pa.default_memory_pool()  # Arrow reads the setting now
        finally:
            del os.environ["ARROW_DEFAULT_MEMORY_POOL"]
    import pyarrow as pa

    try:
        pool = pa.jemalloc_memory_pool() if name == "jemalloc" else pa.system_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)
    if pool.backend_name == "jemalloc":
        pa.jemalloc_set_decay_ms(0)  # freed pages go back to the OS at once (a request's buffers, then nothing)
    return str(pool.backend_name)


def start_child(pool: str | None, then: str, *arguments: object) -> None:
    """A child process's initializer (``ProcessPoolExecutor``, spawned): Arrow's pool ``pool`` (the parent's, e.g.
    ``comgra``'s jemalloc; None: pyarrow's default) before pyarrow loads, then ``then(*arguments)`` (``module:name``,
    imported only after the choice, as it may load pyarrow). This module loads nothing heavy, so a spawned child
    that unpickles this function as its initializer has not loaded pyarrow yet (``comgra``'s main module is light
    too: ``comgra --help`` loads no pyarrow). The findings scan's child (``service/scan_process.py``) starts so:
    with mimalloc, pyarrow's default, it kept what each scan of a live trial freed (504-516 MiB at 20 minutes,
    against 383-390 MiB with jemalloc; docs/performance.md)."""
    if pool in ("jemalloc", "system") and not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        _choose(pool)
    module, _, name = then.partition(":")
    getattr(importlib.import_module(module), name)(*arguments)

