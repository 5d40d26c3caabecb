"""The benchmarks' synthetic recordings repeat steps to be written fast; the scan must not find links that
come only from the copying (issue 8: 16 correlation hints at +-1.00 on the 50x recording)."""
from __future__ import annotations

from comgra.analysis import ScanOptions, Scanner


def correlation_hints(tmp_path, synthetic) -> list[str]:
    group = synthetic.write_recording(tmp_path, synthetic.Options(scale=0.25, trials=1, distinct_steps=4))
    return [f.message for f in Scanner().scan(group, options=ScanOptions()).findings if f.detector == "correlation"]


def test_repeated_steps_of_the_synthetic_recording_give_no_correlation_hint(tmp_path, synthetic) -> None:
    """Every value is an independent draw: no tensor is linked to the loss per sample."""
    assert correlation_hints(tmp_path, synthetic) == []


def test_repeated_steps_that_pair_the_samples_alike_would_give_false_hints(tmp_path, synthetic, monkeypatch) -> None:
    """Without the shuffle, the 4 distinct steps' chance links are counted once per copy: the test above could fail."""
    monkeypatch.setattr(synthetic, "shuffled_samples", lambda table: table)
    assert len(correlation_hints(tmp_path, synthetic)) >= 3
