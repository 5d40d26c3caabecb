"""Where ``comgra-test-run`` writes by default, so that ``comgra --use-path-for-test-run`` finds it.

A per-user data folder rather than the installed package: site-packages may be read-only and is
replaced on every upgrade. Light on purpose (no torch), because the GUI imports it too.
"""
from __future__ import annotations

from pathlib import Path

import platformdirs

__all__ = ["DEFAULT_TEST_RUN_GROUP", "default_test_run_group_path", "default_test_run_path"]

DEFAULT_TEST_RUN_GROUP = "testcase_for_demonstration"


def default_test_run_path() -> Path:
    """The root folder of the test run, e.g. ``~/.local/share/comgra/testing_data`` on Linux.

    >>> default_test_run_path().name
    'testing_data'
    """
    return platformdirs.user_data_path("comgra") / "testing_data"


def default_test_run_group_path() -> Path:
    """The group folder that ``comgra --use-path-for-test-run`` opens."""
    return default_test_run_path() / DEFAULT_TEST_RUN_GROUP
