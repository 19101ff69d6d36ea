"""Run by tests/test_routing.py under tests.support.settings_routed: the app on a database of its own."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connections
from django.urls import reverse

from django_jobruns import (
    GiveUp,
    cancel_job_run,
    job_runs,
    pause_job_run,
    restart_job_run,
    run_due_jobs,
    start_job_run,
    unpause_job_run,
)
from django_jobruns.models import JobRun, JobStep, Status
from tests import jobs

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "jobruns"])


def app_tables(alias):
    return sorted(t for t in connections[alias].introspection.table_names() if t.startswith("django_jobruns"))


def test_the_app_lives_on_its_own_database_and_every_path_uses_it(admin_client, tmp_path):
    assert app_tables("default") == [], "the default database holds no table of the app"
    assert app_tables("jobruns") == [
        "django_jobruns_jobattempt",
        "django_jobruns_jobrun",
        "django_jobruns_jobschedule",
        "django_jobruns_jobstep",
    ]

    log = tmp_path / "effects.log"
    run, created = start_job_run("tests.walk", instance="routed", payload={"log": str(log), "passes": 2})
    assert created and start_job_run("tests.walk", instance="routed")[1] is False
    report = run_due_jobs(max_passes=2)
    assert report.completed == 1, report
    assert JobRun.objects.using("jobruns").get(pk=run.pk).status == Status.DONE

    def fails(p):
        p.step("boom", lambda: (_ for _ in ()).throw(GiveUp("no")))

    jobs.BEHAVIOUR["routed-fail"] = fails
    failed, _ = start_job_run("tests.scripted", instance="routed-fail")
    assert run_due_jobs().failed == 1
    assert JobStep.objects.using("jobruns").filter(run_id=failed.pk).exists()
    successor, created = restart_job_run(failed, resume=True)
    assert created and successor.restarted_from_id == failed.pk

    pause_job_run(successor)
    unpause_job_run(successor)
    cancel_job_run(successor, reason="routed")
    assert {r.status for r in job_runs()} == {"done", "failed", "cancelled"}

    out = StringIO()
    call_command("start_job_run", "tests.walk", "--instance", "cmd", stdout=out)
    assert out.getvalue().startswith("started run ")
    call_command("run_due_jobs", "--json", stdout=StringIO())
    out = StringIO()
    call_command("prune_job_runs", "--older-than", "0", "--dry-run", stdout=out)
    assert "would delete" in out.getvalue()
    out = StringIO()
    call_command("job_runs", failed.pk, stdout=out)  # one run in full: its steps from the app's database
    assert "boom" in out.getvalue(), out.getvalue()

    listing = admin_client.get(reverse("admin:django_jobruns_jobrun_changelist"))
    assert listing.status_code == 200 and run.pk in listing.content.decode()
    page = admin_client.get(reverse("admin:django_jobruns_jobrun_change", args=[failed.pk]))
    assert page.status_code == 200 and "boom" in page.content.decode()
    response = admin_client.post(
        reverse("admin:django_jobruns_jobrun_steer", args=[run.pk]), {"verb": "pause"}, follow=True
    )
    assert response.status_code == 200
    assert app_tables("default") == []
    assert JobRun.objects.using("jobruns").count() >= 4
