"""What the scan reads of a trial's evidence, kept once per trial (analysis/evidence_tables.py): each runinfo field's
rows are the rows a filter of the whole table gives, a frame of their own each time they are asked."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from comgra.analysis import evidence_tables
from comgra.analysis.loading import TrialData
from comgra.store.reader import GroupReader


def _data(group: Path, trial: str) -> tuple[TrialData, GroupReader]:
    reader = GroupReader(group)
    return TrialData(trial, pd.DataFrame(), {}, pd.DataFrame(), {}, [], reader=reader.trial(trial)), reader


def test_each_runinfo_field_is_the_filter_of_the_whole_table(recorded_sweep: Path) -> None:
    data, reader = _data(recorded_sweep, "t00003")
    try:
        info = reader.trial("t00003").evidence("runinfo").to_pandas()
        pairs = sorted({(str(s), str(f)) for s, f in zip(info["subject"], info["field"])})
        assert len(pairs) > 10  # modules, parameters, tensors, steps, optimizer groups
        for subject, field in [*pairs, ("module", "no_such_field"), ("no_such_subject", "mode")]:
            found = evidence_tables.runinfo_field(data, subject, field)
            expected = info[(info["subject"] == subject) & (info["field"] == field)]
            assert list(found.columns) == list(expected.columns)
            assert found.reset_index(drop=True).equals(expected.reset_index(drop=True)), (subject, field)
            assert list(found.index) == list(expected.index)  # the rows' labels in the table, as a filter keeps them
    finally:
        reader.close()


def test_a_changed_field_frame_leaves_the_next_answer_alone(recorded_sweep: Path) -> None:
    data, reader = _data(recorded_sweep, "t00003")
    try:
        first = evidence_tables.runinfo_field(data, "module", "mode")
        before = first.copy()
        first["value"] = "changed"
        first.loc[first.index[0], "number"] = -1.0
        assert evidence_tables.runinfo_field(data, "module", "mode").equals(before)
    finally:
        reader.close()
