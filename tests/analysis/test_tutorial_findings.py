"""The tutorial: the bug (leaky ReLU on the output layer) is the top finding of the bugged trial."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
from comgra.analysis import ScanOptions, Scanner  # noqa: E402
from comgra.examples.tutorial import TRIAL_BUGGED, TRIAL_FIXED, run_tutorial  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    root = tmp_path_factory.mktemp("tutorial_findings")
    group = run_tutorial(root, steps=300, min_training_steps_difference=50, hidden_size=32, progress=False)
    return Scanner().scan(group, options=ScanOptions()).findings


def test_one_sided_output_of_the_bugged_trial_ranks_above_the_fixed_trials(findings) -> None:
    def rank(trial):
        return next((i for i, f in enumerate(findings) if f.detector == "one_sided" and f.trial == trial
                     and f.node == "subnet_out__out"), len(findings))

    bugged = findings[rank(TRIAL_BUGGED)]
    assert bugged.severity == "warning" and bugged.evidence["feeds_output"]
    assert 0 < bugged.evidence["ratio"] < 0.02  # leaky ReLU's slope is 0.01
    assert rank(TRIAL_BUGGED) < rank(TRIAL_FIXED)
    assert rank(TRIAL_BUGGED) == 0  # the bug is the first thing the user reads


def test_loss_per_sample_is_linked_to_helper_partial_sums(findings) -> None:
    hints = [f for f in findings if f.detector == "correlation" and f.node == "helper_partial_sums"]
    assert hints, [f.message for f in findings if f.detector == "correlation"]
    hint = hints[0]
    assert hint.evidence["target"] == "loss_per_sample" and hint.evidence["q_value"] < 0.01
    assert hint.message.startswith("loss_per_sample is high when")


def test_the_helper_roles_holding_the_same_values_give_one_hint_per_trial(findings) -> None:
    """At the last iteration, where the loss per sample is recorded, final_sums and partial_sums are the same
    tensor: one hint names both, not two hints with the same evidence."""
    hints = [f for f in findings if f.detector == "correlation" and f.node == "helper_partial_sums"]
    assert sorted(f.trial for f in hints) == sorted({f.trial for f in hints}), [f.message for f in hints]
    for hint in hints:
        assert {"final_sums", "partial_sums"} <= set(hint.evidence["roles"]), hint.message
        assert hint.role == hint.evidence["roles"][0] and "final_sums and partial_sums" in hint.message


def test_neither_trial_has_errors(findings) -> None:
    assert [f.message for f in findings if f.severity == "error"] == []
