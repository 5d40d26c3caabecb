"""Runnable examples: the tutorial task and a custom visualization for it."""
