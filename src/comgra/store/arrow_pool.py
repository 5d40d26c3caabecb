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

import os
import sys

POOL = "jemalloc"


def use_arrow_pool_that_gives_back() -> str | None:
    """Make jemalloc (else the system allocator) Arrow's pool in this process; returns its name, or None where the
    user's ``ARROW_DEFAULT_MEMORY_POOL`` says otherwise.

    Called first thing when ``comgra`` serves, before pyarrow is imported: Arrow's C++ code takes its pool
    from ``ARROW_DEFAULT_MEMORY_POOL`` once, when pyarrow loads. The setting stays in the environment, naming the
    pool chosen, so that the findings scan's child (``service/scan_process.py``, spawned) loads pyarrow with the same
    pool: with mimalloc it kept what each scan of a live trial freed (523 MiB at 20 minutes, against 361 MiB for
    the whole trial scanned once with jemalloc; docs/performance.md). Where pyarrow is loaded already, the pool
    pyarrow's own calls use is set (parts of Arrow's C++ code then still use mimalloc). A notebook's app runs in
    the user's process and never calls this: its pool is the user's."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return None
    if "pyarrow" not in sys.modules:
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = POOL
        import pyarrow as pa

        pa.default_memory_pool()  # Arrow reads the setting now
    import pyarrow as pa

    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = str(pool.backend_name)  # for the scan's child (see above)
    give_back_at_once()
    return str(pool.backend_name)


def give_back_at_once() -> None:
    """Where Arrow's pool is jemalloc: pages freed go back to the OS at once (a request's buffers, then nothing), not
    after jemalloc's decay of a second. The scan's child calls this too: the decay is not in the environment."""
    import pyarrow as pa

    if pa.default_memory_pool().backend_name == "jemalloc":
        pa.jemalloc_set_decay_ms(0)
