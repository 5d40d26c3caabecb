"""The Health tab's messages: cut at a word with an ellipsis, the whole text on hover (server/health_view.py)."""
from __future__ import annotations

from comgra.server.health_view import clipped


def test_a_long_message_is_cut_between_words_with_an_ellipsis_and_kept_whole_in_its_title():
    text = ("Node 'encoder.layers.3.attention.output' has 12 of 64 units that never activate on any recorded step "
            "from 0 to 19000, which looks like dying ReLUs after the learning-rate warm-up ended at step 400.")
    span = clipped(text, 100)
    assert span.title == text and span.children.endswith("…") and len(span.children) <= 100
    kept = span.children[:-1]
    assert text.startswith(kept) and text[len(kept)] in " ,;:."


def test_a_short_message_is_whole_and_a_word_longer_than_the_limit_is_cut_inside():
    assert clipped("No units died.", 100).children == "No units died."
    span = clipped("x" * 300, 100)
    assert span.children == "x" * 99 + "…" and span.title == "x" * 300
