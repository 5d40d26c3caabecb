"""The run state's writes (breakpoints/run_state_writer.py): the periodic one off the calling thread, the ones that must
land in order at once, and a queued write never after a later one."""
from __future__ import annotations

import threading
import time

from comgra.breakpoints import run_state_writer


def test_a_queued_write_runs_on_another_thread_and_reports_its_error_there() -> None:
    done, where, errors = threading.Event(), [], []

    def write() -> None:
        where.append(threading.current_thread().name)
        done.set()
    run_state_writer.soon("trial-a", write, errors.append)
    assert done.wait(5)
    assert where == ["comgra-run-state"]
    failed = threading.Event()

    def broken() -> None:
        raise OSError(28, "No space left on device")
    run_state_writer.soon("trial-a", broken, lambda error: (errors.append(error), failed.set()))
    assert failed.wait(5) and isinstance(errors[0], OSError)


def test_a_write_queued_before_a_write_now_never_lands_after_it() -> None:
    """The thread is held inside a first write; a second is queued; then one is written at once (a "finished"):
    the queued one is dropped, whoever takes the lock first."""
    written: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def first() -> None:
        inside.set()
        release.wait(5)
        written.append("first")
    run_state_writer.soon("trial-b", first, lambda error: None)
    assert inside.wait(5)
    run_state_writer.soon("trial-b", lambda: written.append("queued running"), lambda error: None)
    threading.Timer(0.2, release.set).start()
    run_state_writer.now("trial-b", lambda: written.append("finished"))  # waits for the write in progress
    time.sleep(0.3)  # the thread had its chance at the queued one
    assert written == ["first", "finished"]


def test_only_the_latest_queued_write_of_a_trial_lands() -> None:
    written: list[int] = []
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(5)
    run_state_writer.soon("trial-c", hold, lambda error: None)
    assert inside.wait(5)
    for number in range(5):
        run_state_writer.soon("trial-c", lambda number=number: written.append(number), lambda error: None)
    release.set()
    deadline = time.monotonic() + 5
    while not written and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert written == [4]
