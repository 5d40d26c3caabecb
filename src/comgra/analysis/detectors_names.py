"""The names of the built-in detectors (light: read before the detectors' libraries are loaded)."""
from __future__ import annotations

BUILT_IN = frozenset({
    "non_finite", "gradients", "growth", "collapse", "dead_units", "saturated_units", "one_sided", "parameters",
    "outliers", "correlation", "loss_curve", "constant_data", "transient_jumps", "output_range", "probabilities_to_loss", "updates", "stale_gradients",
    "shapes", "growth_within_step", "growth_along_edges", "detached", "dying_units", "identical_units",
    "sparse_units", "co_occurrence",
    "run_modes", "optimizer_groups", "rank_agreement", "sentinel_events", "profile_spikes",
})
