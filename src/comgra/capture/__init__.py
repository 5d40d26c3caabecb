"""Recording named tensors: registration, autograd traversal, on-device statistics, the recorded step (the
torch side of recording; per-layer profiling lives beside it in ``profiling``)."""
