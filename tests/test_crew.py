"""A drive's threads (``crew.Crew``): none is left running into the next round, whatever ends the wait for them."""

from __future__ import annotations

import threading

import pytest

from django_jobruns.crew import Crew


def test_an_error_of_what_the_calling_thread_does_meanwhile_is_raised_once_every_thread_has_ended():
    release, never, ended = threading.Event(), threading.Event(), threading.Event()

    def work() -> None:
        release.wait(timeout=20)
        never.wait(timeout=0.5)  # still running for a while once ``meanwhile`` has raised
        ended.set()

    def meanwhile() -> None:
        release.set()
        raise RuntimeError("meanwhile failed")

    crew = Crew(2)
    try:
        with pytest.raises(RuntimeError, match="meanwhile failed"):
            crew.run(work, 1, meanwhile, 0.01)
        assert ended.is_set()  # raised only after the thread ended
    finally:
        crew.close()


def test_what_the_calling_thread_does_meanwhile_runs_while_the_threads_work():
    calls: list[int] = []
    done = threading.Event()

    def work() -> None:
        done.wait(timeout=20)

    def meanwhile() -> None:
        calls.append(1)
        if len(calls) == 3:
            done.set()

    with Crew(2) as crew:
        crew.run(work, 2, meanwhile, 0.01)
    assert len(calls) >= 3 and done.is_set()
