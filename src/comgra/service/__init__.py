"""The questions the app and the REST API both ask about a recording, answered from the store as plain data.

One module per kind of question, composed by one facade (``RecordingService``, ``facade.py``):

- ``selection``: what a view is: the selection, its URL state (``view_link``), the answer's value types;
- ``trials``: which trials and ranks, notes, KPIs, module trees, problems;
- ``steps`` (with ``read_threads``): the step index, kept steps, read-ahead and whole-trial series;
- ``resolve``: a wanted selection turned into one that exists, saying what changed;
- ``panels``: hover cards, samples table, neuron values, step navigation, comparisons;
- ``findings``: the background scanner's findings, badges and links;
- ``live``: per-layer profiling and resource samples.

Imports flow one way inside: ``selection`` <- ``trials``/``steps`` <- ``resolve`` <- ``panels`` <- ``facade``;
``findings`` and ``live`` stand beside them. Nothing here imports torch or Dash. The names below are
those ``comgra.service`` always offered.

    >>> from comgra.service import RecordingService                                   # doctest: +SKIP
    >>> RecordingService("/path/to/root/group").resolve({"node_id": "input"}).selection  # doctest: +SKIP
"""
from __future__ import annotations

from comgra.service.facade import RecordingService
from comgra.service.findings import FindingsProgress, FindingsWorker, finding_link, scan_options
from comgra.service.panels import NEURON, Comparison, NeuronValues, SampleColumn, SamplesTable, visualization_selection
from comgra.service.read_threads import LOW_PRIORITY_NICE, ReadSuperseded
from comgra.service.resolve import resolve
from comgra.service.selection import (
    AGGREGATION_LABELS, ANY_TYPE, BATCH_AGGREGATIONS, NOTICE_TOPICS, PLOT_STATISTICS, URL_KEYS, Choices, Notice,
    Selection, Series, View, aggregation_label, aggregation_value, clean_wanted, parse_aggregation, view_link,
    wanted_from_query,
)
from comgra.service.steps import (
    SERIES_CACHE_SIZE, STEP_CACHE_SIZE, STEPS_KEPT_AHEAD, STEPS_READ_AHEAD, STEPS_READ_BEHIND, KeptStep, StepIndex,
    StepReads, neighbour_steps, prefetch_window, series,
)
from comgra.service.trials import TrialQuestions

__all__ = [
    "AGGREGATION_LABELS", "ANY_TYPE", "BATCH_AGGREGATIONS", "LOW_PRIORITY_NICE", "NEURON", "NOTICE_TOPICS",
    "PLOT_STATISTICS", "SERIES_CACHE_SIZE", "STEPS_KEPT_AHEAD", "STEPS_READ_AHEAD", "STEPS_READ_BEHIND",
    "STEP_CACHE_SIZE", "URL_KEYS", "Choices", "Comparison", "FindingsProgress", "FindingsWorker", "KeptStep",
    "NeuronValues", "Notice", "ReadSuperseded", "RecordingService", "SampleColumn", "SamplesTable", "Selection",
    "Series", "StepIndex", "StepReads", "TrialQuestions", "View", "aggregation_label", "aggregation_value",
    "clean_wanted", "finding_link", "neighbour_steps", "parse_aggregation", "prefetch_window", "resolve",
    "scan_options", "series", "view_link", "visualization_selection", "wanted_from_query",
]
