"""The breakpoint condition language: what it accepts, what it computes, and that nothing else runs."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comgra.errors import BreakpointError, ComgraError
from comgra.breakpoints.conditions import METRICS, parse_condition


@pytest.mark.parametrize("text, metrics, expected", [
    ("grad_norm < 1e-3 and step > 100", {"grad_norm": 1e-4, "step": 120}, True),
    ("grad_norm < 1e-3 and step > 100", {"grad_norm": 1e-4, "step": 100}, False),
    ("has_nan", {"has_nan": 1.0}, True),
    ("not has_nan", {"has_nan": 0.0}, True),
    ("abs_max > 1e4 or has_inf", {"abs_max": 5.0, "has_inf": 0.0}, False),
    ("execution_time > 0.5", {"execution_time": 0.6}, True),
    ("mean > 33", {"mean": 33.0}, False),
    ("0 < mean <= 1", {"mean": 1.0}, True),
    ("0 < mean <= 1", {"mean": 1.5}, False),
    ("max - min > 2 * std", {"max": 3.0, "min": -1.0, "std": 1.0}, True),
    ("-mean == 2", {"mean": -2.0}, True),
    ("mean / 0 > 1", {"mean": 1.0}, True),  # x/0 is inf, not an exception in the training process
    ("mean > 1", {"mean": math.nan}, False),  # NaN compares false, as in torch
    ("step == 3 and true", {"step": 3}, True),
])
def test_conditions_compute_what_they_say(text: str, metrics: dict[str, float], expected: bool) -> None:
    assert parse_condition(text).evaluate(metrics) is expected


def test_a_condition_lists_the_metrics_it_reads() -> None:
    condition = parse_condition("abs_max > 1e4 and grad_norm < 1 and step > 3")
    assert condition.names == {"abs_max", "grad_norm", "step"}
    assert condition.value_metrics == ("abs_max",) and condition.gradient_metrics == ("grad_norm",)


@pytest.mark.parametrize("text, token", [
    ("__import__('os').system('true')", "__import__('os').system('true')"),
    ("mean.__class__", "mean.__class__"),
    ("loss > 1", "'loss'"),
    ("mean ** 99999999", "mean ** 99999999"),
    ("[mean]", "[mean]"),
    ("'a' < mean", "'a'"),
    ("mean if step else 0", "mean if step else 0"),
    ("lambda: 1", "lambda: 1"),
    ("abs(mean) > 1", "abs(mean)"),
    ("mean > 1; import os", "not a valid expression"),
    ("mena > 1", "did you mean 'mean'"),
])
def test_everything_else_is_rejected_naming_the_bad_token(text: str, token: str) -> None:
    with pytest.raises(BreakpointError) as caught:
        parse_condition(text)
    assert caught.value.field == "condition"
    assert token in str(caught.value)
    assert "grad_norm" in str(caught.value)  # the message lists what is valid


@pytest.mark.parametrize("value", [None, 3, b"mean > 1", "", "   ", "x" * 501])
def test_a_condition_must_be_a_short_nonempty_string(value: object) -> None:
    with pytest.raises(BreakpointError, match="condition"):
        parse_condition(value)


def test_a_number_too_large_for_a_float_is_refused() -> None:
    with pytest.raises(BreakpointError, match="too large"):
        parse_condition("mean > " + "9" * 400)


class Ran(Exception):
    pass


_SENTINEL: list[str] = []


def _tripwire(*args: object) -> None:
    _SENTINEL.append("ran")
    raise Ran


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(list(METRICS) + ["__import__", "tripwire", "(", ")", ".", "[", "]", "'x'", "lambda",
                                             ":", "and", "or", "not", "<", ">", "==", "1e3", "-", "*", "**", "if",
                                             "else", ",", "for", "in", "__class__", "__subclasses__", "()"]),
             max_size=20).map(" ".join),
))
def test_hostile_strings_never_execute_and_only_raise_comgra_errors(text: str) -> None:
    try:
        condition = parse_condition(text)
    except ComgraError:
        return
    # What parses evaluates to a bool over metrics alone: no name outside the metrics, no call.
    metrics = {name: 1.0 for name in METRICS}
    metrics_with_tripwire = {**metrics, "tripwire": _tripwire, "__import__": _tripwire}
    assert isinstance(condition.evaluate(metrics_with_tripwire), bool)
    assert condition.names <= set(METRICS)
    assert not _SENTINEL
