"""Registering jobs: keys, duplicates, autodiscovery, lookups."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_jobruns import job
from django_jobruns.exceptions import AlreadyRegistered, UnknownJob
from django_jobruns.registry import Job, get_job, registered_jobs, unregister
from tests import jobs


def test_jobs_py_of_each_app_is_autodiscovered():
    labels = {entry.label for entry in registered_jobs()}
    assert {"tests.walk", "tests.scripted", "tests.blocking", "demo.import_catalog"} <= labels


def test_job_is_keyed_by_app_label_and_name_and_stays_callable():
    assert isinstance(jobs.walk, Job)
    assert (jobs.walk.module, jobs.walk.name, jobs.walk.key) == ("tests", "walk", ("tests", "walk"))
    assert get_job("tests.walk") is jobs.walk
    assert jobs.walk.__name__ == "walk" and jobs.walk.retry is jobs.FAST_RETRY


def test_registering_a_key_twice_is_an_error():
    @job("twice")
    def first(p):
        return None

    try:
        with pytest.raises(AlreadyRegistered, match="'tests.twice' is already registered"):

            @job("twice")
            def second(p):
                return None

        assert get_job("tests.twice") is first
    finally:
        unregister("tests.twice")


def test_job_is_usable_bare_and_takes_a_lease():
    @job
    def bare_job(p):
        return {"done": True}

    @job(lease=1800)
    def long_steps(p):
        return {"done": True}

    try:
        assert get_job("tests.bare_job") is bare_job and bare_job.lease is None
        assert long_steps.lease == timedelta(minutes=30)
    finally:
        unregister("tests.bare_job")
        unregister("tests.long_steps")


def test_bad_registrations_are_refused():
    with pytest.raises(ValueError, match="lease must be positive"):
        job(lease=0)
    with pytest.raises(ValueError, match="lease must be a timedelta or a finite number"):
        job(lease=float("inf"))
    with pytest.raises(ValueError, match="timeout must be a timedelta or a finite number"):
        job(timeout=float("nan"))
    with pytest.raises(ValueError, match="timeout must be at least 5 seconds"):
        job(timeout=timedelta(seconds=1))
    with pytest.raises(ValueError, match="timeout must be at most a week"):
        job(timeout=1e300)
    with pytest.raises(ValueError, match="lease must be at least 5 seconds"):
        job(lease=timedelta(seconds=1))
    with pytest.raises(ValueError, match="without dots"):
        job("a.b")
    with pytest.raises(TypeError, match="RetryPolicy"):
        job(retry={"max_attempts": 3})  # type: ignore[call-overload]


def test_unknown_jobs_are_lookup_errors_with_a_clear_message():
    with pytest.raises(UnknownJob, match=r"registered: .*tests\.walk"):
        get_job("tests.unknown")
    with pytest.raises(LookupError):
        get_job("nodots")
