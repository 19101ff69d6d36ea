"""Starts racing runs finishing, from several processes on one key: nothing raised, nothing lost.

On MariaDB a start inserting a key while a pass commit frees it deadlocks in
InnoDB's index locks; both sides retry. Effects are counted in a log the step
bodies append to, independently of the engine's records.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter

import pytest

from django_jobruns.models import JobRun, Status
from tests.conftest import effect_lines, spawn_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PROCESSES, ROUNDS = 4, 40


def test_starts_racing_completions_on_one_key_lose_nothing(effects):
    from tests.support.process_helpers import start_and_drive

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    queue = ctx.Queue()
    env = spawn_env()
    procs = [
        ctx.Process(target=start_and_drive, args=(env, barrier, queue, str(effects), ROUNDS)) for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    problems = [problem for r in results for problem in r["problems"]]
    unrecorded = [message for r in results for message in r["unrecorded"]]
    assert problems == [] and unrecorded == []
    created = sum(r["starts"] for r in results)
    runs = JobRun.objects.filter(instance="hot")
    assert runs.count() == created
    # Every run ended done, each step body ran once per run, and no run is left in flight.
    assert not runs.filter(status=Status.RUNNING).exclude(lease_holder=None).exists()
    finished = runs.filter(status=Status.DONE).count()
    assert finished == sum(r["completed"] for r in results)
    lines = effect_lines(effects)
    assert len(lines) == finished and max(Counter(lines).values()) == 1
