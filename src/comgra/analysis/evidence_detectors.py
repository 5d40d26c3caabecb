"""The detectors that read the evidence beside the tensors (issue 24): the ``runinfo`` and ``sentinels`` tables and
the profiling table. Registered in ``comgra.analysis.detectors.DETECTORS`` like the others, and run by a streamed
scan too (their tables are small: read whole either way)."""
from __future__ import annotations

from comgra.analysis import optimizer_groups, profile_spikes, rank_agreement, run_modes, sentinel_events

__all__ = ["EVIDENCE", "sentinel_events"]

EVIDENCE = {
    "run_modes": run_modes.detect,
    "optimizer_groups": optimizer_groups.detect,
    "rank_agreement": rank_agreement.detect,
    "sentinel_events": sentinel_events.detect,
    "profile_spikes": profile_spikes.detect,
}
