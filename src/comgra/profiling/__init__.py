"""Per-layer profiling and resource sampling, beside ``capture`` (which records named tensors).

``instruments.Instruments`` is what the recorder wires: the per-layer profiler (``profiler.py``: module
calls timed by class-level ``forward`` wrappers in ``forward_wrappers.py`` and ``layer_calls.py``, the
backward pass attributed by the C++ marker of ``native_marker.py`` and ``backward_slices.py``, memory,
FLOPs and output statistics in ``layer_extras.py``, rows of the ``layers`` table in ``layer_rows.py``) and
the resource sampler (``resources.py``: psutil and NVML on a background thread). Nothing here imports
the recorder, ``capture`` or ``breakpoints``; everything is written through ``store``.
"""
