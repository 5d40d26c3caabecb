"""The README's quick start and .ci/run agree (issue 25, item 2): the main-job line installs what running needs
(not the test extra), the test command installs what testing needs, and CI runs exactly that test command."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quick_start_blocks() -> tuple[str, str]:
    """The quick start's first bash block (the main job) and the one after "Run the tests with:"."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick start"):]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    tests = re.search(r"Run the tests with:\s*```bash\n(.*?)```", section, flags=re.S)
    assert blocks and tests, "the quick start has a main-job block and a test block"
    return blocks[0].strip(), tests.group(1).strip()


def test_the_main_job_installs_what_running_needs_and_the_tests_what_testing_needs() -> None:
    main_job, test_command = _quick_start_blocks()
    install = next(line for line in main_job.splitlines() if "pip install" in line)
    assert "[test]" not in install and "-e ." in install and "torch==" in install
    assert '-e ".[test]"' in test_command and "pytest" in test_command


def test_ci_runs_the_readmes_test_command_as_written() -> None:
    _, test_command = _quick_start_blocks()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci  # the whole line, as the README writes it
