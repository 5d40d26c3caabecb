"""Jargon kept out of what the page shows (issue 33): the recorder's default type of step and a role that only
repeats its node's name stay in the page's state, not in the text a person reads."""
from __future__ import annotations

from types import SimpleNamespace

from comgra.server.tensors import tensor_name
from comgra.server.values_view import breadcrumb


def selection(node: str, role: str, step_type: str) -> SimpleNamespace:
    return SimpleNamespace(node=node, role=role, step_type=step_type, aggregation="batch", kind="tensor",
                           training_step=120, iteration=0, data_iteration=0, trial="bugged")


def shown_text(lines: list[list[dict]]) -> str:
    return " | ".join("".join(part["text"] for part in line if not part.get("hidden")) for line in lines)


def fields(lines: list[list[dict]]) -> dict[str, str]:
    return {part["field"]: part["text"] for line in lines for part in line if "field" in part}


def test_the_default_type_of_step_and_a_repeated_role_are_not_shown_but_kept() -> None:
    lines = breadcrumb(selection("main_model.weight", "main_model.weight", "main_execution_type"), None)
    text = shown_text(lines)
    assert "main_execution_type" not in text and "()" not in text and "step 120 |" in text
    assert text.count("main_model.weight") == 1
    assert fields(lines)["type_of_execution"] == "main_execution_type"  # the page's state still has it
    assert fields(lines)["role"] == "main_model.weight"


def test_a_named_type_of_step_and_a_distinct_role_are_shown() -> None:
    text = shown_text(breadcrumb(selection("helper", "partial_sums", "length_3"), None))
    assert "step 120 (length_3)" in text and "helper [partial_sums]" in text


def test_figure_titles_name_the_tensor_without_repeating_the_node() -> None:
    assert tensor_name(selection("main_model.weight", "main_model.weight", "t")) == "main_model.weight"
    assert tensor_name(selection("helper", "partial_sums", "t")) == "helper [partial_sums]"


def test_the_type_selector_names_the_default_type_in_plain_words() -> None:
    from comgra.server.view_state import type_label
    from comgra.service import ANY_TYPE

    assert type_label("main_execution_type") == "Steps of no named type"
    assert type_label(ANY_TYPE) == "Any training step" and type_label("05_iterations") == "05_iterations"
