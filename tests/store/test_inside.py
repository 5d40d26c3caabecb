"""``validation.inside``: whether a path, every link followed, lies in a folder. The reader asks it of each trial
folder and trial.json it opens (a recording from a stranger may hold links out of it); a path below the folder
with no link among its parts is answered without resolving it whole, every other one with ``realpath``."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from comgra.store.validation import inside


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    group, outside = tmp_path / "group", tmp_path / "outside"
    (group / "trials" / "t0").mkdir(parents=True)
    (group / "trials" / "t0" / "trial.json").write_text("{}")
    (outside / "t1").mkdir(parents=True)
    (outside / "secret.json").write_text("{}")
    return group, outside


def test_plain_paths_below_the_folder_are_inside(tree: tuple[Path, Path]) -> None:
    group, _ = tree
    assert inside(group / "trials" / "t0" / "trial.json", group)
    assert inside(group / "trials" / "t0", group / "trials")
    assert inside(group, group)
    assert inside(group / "trials" / "not-yet-written.json", group)  # as realpath answers it


def test_links_out_of_the_folder_are_outside(tree: tuple[Path, Path]) -> None:
    group, outside = tree
    (group / "trials" / "t1").symlink_to(outside / "t1")
    (group / "trials" / "t0" / "stolen.json").symlink_to(outside / "secret.json")
    assert not inside(group / "trials" / "t1", group)
    assert not inside(group / "trials" / "t0" / "stolen.json", group / "trials" / "t0")


def test_a_link_that_stays_inside_is_inside(tree: tuple[Path, Path]) -> None:
    group, _ = tree
    (group / "trials" / "again").symlink_to(group / "trials" / "t0")
    assert inside(group / "trials" / "again" / "trial.json", group)


def test_dot_dot_through_a_link_is_resolved_as_the_kernel_does(tree: tuple[Path, Path]) -> None:
    group, outside = tree
    (outside / "t1" / "deep").mkdir()
    (group / "trials" / "hop").symlink_to(outside / "t1" / "deep")
    # Written, it ends inside the group; resolved, "hop/.." is outside/t1: outside.
    path = Path(str(group / "trials" / "hop") + "/../t0")
    assert not inside(path, group)
    assert inside(Path(str(group / "trials" / "t0") + "/../t0/trial.json"), group)
    assert not inside(group / ".." / "outside" / "secret.json", group)


def test_a_folder_that_is_itself_a_link_holds_what_is_below_it(tree: tuple[Path, Path], tmp_path: Path) -> None:
    group, _ = tree
    alias = tmp_path / "alias"
    alias.symlink_to(group)
    assert inside(alias / "trials" / "t0" / "trial.json", alias)
    assert inside(alias / "trials" / "t0" / "trial.json", group)  # resolved whole: the same folder
    assert not inside(group / "trials", group / "trials" / "t0")


def test_relative_paths(tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    group, outside = tree
    monkeypatch.chdir(group)
    assert inside(Path("trials") / "t0", group)
    assert inside(group / "trials", Path("."))
    os.symlink(outside, group / "out")
    assert not inside(Path("out") / "secret.json", Path("."))
