"""The admin in a real browser: headless Chromium from Debian, driven by Selenium."""

from __future__ import annotations

import os
import re
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_jobruns import start_job_run
from django_jobruns.models import JobRun, JobStep, Status

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HAVE_BROWSER = Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()

if not HAVE_BROWSER and os.environ.get("JOBRUNS_REQUIRE_BROWSER"):
    raise RuntimeError(f"JOBRUNS_REQUIRE_BROWSER is set but {CHROMIUM} or {CHROMEDRIVER} is missing")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not HAVE_BROWSER, reason="needs Debian's chromium and chromium-driver"),
]


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(10)
    yield driver
    driver.quit()


@pytest.fixture
def screenshots(tmp_path):
    folder = Path(os.environ.get("JOBRUNS_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _seed():
    now = timezone.now()
    for n, (instance, status) in enumerate(
        [("supplier-1", Status.DONE), ("supplier-2", Status.DONE), ("supplier-3", Status.RUNNING)]
    ):
        run, _ = start_job_run("demo.import_catalog", instance=instance, payload={"supplier": n + 1})
        imported = 10000 if status == Status.DONE else 4500
        fields: dict[str, Any] = {"counters": f'{{"imported": {imported}, "total": 10000}}', "cursor": str(imported)}
        if status == Status.DONE:
            fields.update(status=status, live=None, ended_at=now)
        JobRun.objects.filter(pk=run.pk).update(**fields)
    failed, _ = start_job_run("demo.import_catalog", instance="supplier-4", payload={"supplier": 4})
    JobRun.objects.filter(pk=failed.pk).update(
        status=Status.FAILED,
        live=None,
        ended_at=now,
        attempts=5,
        cursor="7500",
        counters='{"imported": 7500, "total": 10000}',
        last_error="step 'fetch:7500' failed (attempt 5 of 5): UpstreamUnavailable: supplier 4: connection reset",
    )
    JobStep.objects.create(
        run=failed,
        step="fetch:7500",
        result=None,
        attempts=5,
        last_error="UpstreamUnavailable: supplier 4: connection reset",
        recorded_at=now,
    )
    return failed


@pytest.mark.django_db(transaction=True)
def test_operator_filters_to_failed_runs_and_restarts_one(browser, live_server, screenshots):
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("admin", password="jobruns-demo")
    failed = _seed()

    log_in(browser, live_server, "/admin/django_jobruns/jobrun/")
    assert browser.find_element(By.ID, "result_list")
    browser.save_screenshot(str(screenshots / "changelist.png"))

    browser.find_element(By.XPATH, "//*[@id='changelist-filter']//a[normalize-space()='failed']").click()
    assert "status__exact=failed" in browser.current_url
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1 and "supplier-4" in rows[0].text

    rows[0].find_element(By.LINK_TEXT, failed.pk).click()
    assert "Cannot decode" not in browser.page_source
    assert browser.find_element(By.CSS_SELECTOR, ".field-cursor_display pre").text == "7500"
    browser.save_screenshot(str(screenshots / "change-view.png"))

    browser.find_element(By.ID, "jobruns-restart").click()
    success = browser.find_element(By.CSS_SELECTOR, "ul.messagelist li.success")
    assert f"Restarted failed run {failed.pk} as new run" in success.text
    new = JobRun.objects.get(restarted_from=failed)
    assert browser.current_url.endswith(f"/admin/django_jobruns/jobrun/{new.pk}/change/")
    assert new.status == Status.RUNNING and new.cursor is None


def log_in(browser, live_server, destination):
    """Log in as the demo admin and wait until the browser has arrived at ``destination``.

    The click only sends the form: a ``get`` issued before the answer arrives can race the session
    cookie and land on the login page again.
    """
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{live_server.url}/admin/login/?next={destination}")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("jobruns-demo")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 15).until(lambda driver: driver.current_url == f"{live_server.url}{destination}")


def success_says(browser, text):
    """Wait for the page the click led to, until its success message says ``text``."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def arrived(driver):
        try:
            return text in driver.find_element(By.CSS_SELECTOR, "ul.messagelist li.success").text
        except (NoSuchElementException, StaleElementReferenceException):
            return False

    WebDriverWait(browser, 15, ignored_exceptions=(StaleElementReferenceException,)).until(arrived)


@pytest.mark.django_db(transaction=True)
def test_operator_pauses_unpauses_and_cancels_a_running_run(browser, live_server, screenshots):
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("admin", password="jobruns-demo")
    _seed()
    running = JobRun.objects.get(instance="supplier-3")

    log_in(browser, live_server, f"/admin/django_jobruns/jobrun/{running.pk}/change/")

    browser.find_element(By.ID, "jobruns-pause").click()
    success_says(browser, f"Paused run {running.pk}")
    assert "running (paused)" in browser.find_element(By.CSS_SELECTOR, ".field-status_badge").text
    assert JobRun.objects.get(pk=running.pk).paused_at is not None
    browser.save_screenshot(str(screenshots / "paused.png"))

    browser.find_element(By.ID, "jobruns-unpause").click()
    success_says(browser, f"Unpaused run {running.pk}")
    assert JobRun.objects.get(pk=running.pk).paused_at is None

    browser.find_element(By.ID, "jobruns-cancel").click()  # final: a page of its own asks first
    assert f"Cancel run {running.pk}?" in browser.title
    assert JobRun.objects.get(pk=running.pk).status == Status.RUNNING
    browser.save_screenshot(str(screenshots / "cancel-confirmation.png"))
    browser.find_element(By.ID, "jobruns-reason").send_keys("supplier asked us to stop")
    browser.find_element(By.ID, "jobruns-confirm-cancel").click()
    success_says(browser, f"Cancelled run {running.pk}")
    cancelled = JobRun.objects.get(pk=running.pk)
    assert cancelled.status == Status.CANCELLED and "supplier asked us to stop" in cancelled.last_error
    assert not browser.find_elements(By.ID, "jobruns-cancel"), "a finished run offers no steering"


@pytest.mark.django_db(transaction=True)
def test_changelist_is_readable_at_1280_px(browser, live_server, screenshots):
    """At 1280×900 every column of a busy changelist is in view: no sideways scrolling, no clipped cell."""
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("admin", password="jobruns-demo")
    _seed()
    now = timezone.now()
    # The widest cells an operator meets: a long job and instance, a long unbroken error, a lapsed
    # lease with a long holder, a run waiting out a backoff.
    run, _ = start_job_run("demo.import_catalog", instance="supplier-" + "x" * 60, payload={})
    JobRun.objects.filter(pk=run.pk).update(
        attempts=3,
        next_attempt_at=now + timedelta(minutes=4),
        lease_holder="worker-host-with-a-long-name.internal.example.com:123456",
        lease_expires_at=now - timedelta(minutes=2),
        last_error="UpstreamUnavailable:" + "connection-reset-by-peer/" * 12,
    )
    browser.set_window_size(1280, 900)
    log_in(browser, live_server, "/admin/django_jobruns/jobrun/")
    assert browser.find_element(By.ID, "result_list")
    browser.save_screenshot(str(screenshots / "changelist-1280.png"))
    sizes = browser.execute_script("""
        const results = document.querySelector('#changelist .results');
        const table = document.getElementById('result_list');
        const right = results.getBoundingClientRect().right;
        const clipped = [...table.querySelectorAll('th, td')]
            .filter(cell => cell.getBoundingClientRect().right > right + 1)
            .map(cell => cell.className || cell.textContent.slice(0, 30));
        const widths = [...table.querySelectorAll('thead th')]
            .map(th => [th.className, Math.round(th.getBoundingClientRect().width)]);
        table.style.width = 'min-content';
        const least = table.getBoundingClientRect().width;
        table.style.width = '';
        return {least: Math.round(least), widths: widths, page: document.documentElement.scrollWidth,
                window: window.innerWidth, box: results.clientWidth, table: results.scrollWidth, clipped: clipped};
    """)
    assert sizes["page"] <= sizes["window"], sizes
    assert sizes["table"] <= sizes["box"], sizes
    assert sizes["clipped"] == [], sizes


@pytest.mark.django_db(transaction=True)
def test_the_overview_shows_each_states_count_and_the_days_chart_in_light_and_dark(browser, live_server, screenshots):
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("admin", password="jobruns-demo")
    _seed()
    now = timezone.now()
    for hours_ago, status in [(1, Status.DONE), (1, Status.DONE), (2, Status.FAILED), (5, Status.DONE)]:
        run, _ = start_job_run("demo.import_catalog", instance=f"earlier-{hours_ago}-{status}-{now.timestamp()}")
        JobRun.objects.filter(pk=run.pk).update(status=status, live=None, ended_at=now - timedelta(hours=hours_ago))
    lapsed, _ = start_job_run("demo.import_catalog", instance="supplier-9")
    JobRun.objects.filter(pk=lapsed.pk).update(lease_holder="host:1:a", lease_expires_at=now - timedelta(minutes=3))
    log_in(browser, live_server, "/admin/django_jobruns/jobrun/")
    tiles = {
        tile.find_element(By.CSS_SELECTOR, ".jobruns-label").text: int(
            tile.find_element(By.CSS_SELECTOR, ".jobruns-count").text
        )
        for tile in browser.find_elements(By.CSS_SELECTOR, ".jobruns-tiles a")
    }
    assert tiles == {
        "running": 2,
        "leased": 0,
        "in backoff": 0,
        "lease lapsed": 1,
        "paused": 0,
        "failed in 24 h": 2,
    }, tiles
    chart = browser.find_element(By.CSS_SELECTOR, "svg.jobruns-chart")
    assert chart.size["width"] > 300 and chart.size["height"] > 60
    bars = browser.execute_script(
        "const height = (g, q) => g.querySelector(q).getBBox().height;"
        "return [...document.querySelectorAll('.jobruns-chart g')].map(g => [g.querySelector('title').textContent,"
        " height(g, '.jobruns-bar-done'), height(g, '.jobruns-bar-failed')])"
    )
    assert len(bars) == 24
    assert bars[-1][0].endswith(": 2 done, 1 failed") and bars[-1][1] > 0 and bars[-1][2] > 0, bars[-1]
    assert bars[-2][0].endswith(": 2 done, 0 failed") and bars[-2][1] > bars[-1][1] - 1, bars[-2]
    browser.save_screenshot(str(screenshots / "overview.png"))

    def colours() -> dict[str, str]:
        found: dict[str, str] = browser.execute_script(
            "const s = (q, p) => getComputedStyle(document.querySelector(q))[p];"
            "return {count: s('.jobruns-tiles .jobruns-count', 'color'),"
            " axis: s('.jobruns-chart .jobruns-axis', 'fill'), page: s('body', 'backgroundColor')};"
        )
        return found

    light = colours()
    browser.execute_script("localStorage.setItem('theme', 'dark')")
    browser.refresh()
    dark = colours()
    browser.save_screenshot(str(screenshots / "overview-dark.png"))
    browser.execute_script("localStorage.removeItem('theme')")

    def luminance(css: str) -> float:
        red, green, blue = (int(part) for part in re.findall(r"\d+", css)[:3])
        return (0.2126 * red + 0.7152 * green + 0.0722 * blue) / 255

    # The overview follows the admin's theme: light figures on the dark page, dark ones on the light.
    assert luminance(light["page"]) > 0.5 and luminance(light["count"]) < 0.5, light
    assert luminance(dark["page"]) < 0.5 and luminance(dark["count"]) > 0.5, dark
    assert light["axis"] != dark["axis"], (light, dark)


@pytest.mark.django_db(transaction=True)
def test_the_change_views_buttons_sit_on_one_line_in_light_and_dark(browser, live_server, screenshots):
    """Every object tool -- the app's forms' buttons, its links, Django's History -- on one baseline, one height."""

    User.objects.create_superuser("admin", password="jobruns-demo")
    failed = _seed()
    running = JobRun.objects.get(instance="supplier-3")
    JobRun.objects.filter(pk=running.pk).update(
        lease_holder="web-3:4242:ab", lease_expires_at=timezone.now() - timedelta(minutes=2)
    )
    log_in(browser, live_server, f"/admin/django_jobruns/jobrun/{running.pk}/change/")
    measure = """
        return [...document.querySelectorAll('.object-tools button, .object-tools a')].map(tool => {
            const box = tool.getBoundingClientRect();
            return [tool.textContent.trim(), Math.round(box.top), Math.round(box.bottom)];
        });
    """
    for theme in ("light", "dark"):
        for run, name in ((running, "lapsed"), (failed, "failed")):
            browser.get(f"{live_server.url}/admin/django_jobruns/jobrun/{run.pk}/change/")
            browser.execute_script(f"localStorage.setItem('theme', '{theme}')")
            browser.refresh()
            assert "jobruns-summary" in browser.page_source
            tools = browser.execute_script(measure)
            assert len(tools) >= 2, tools
            assert len({top for _, top, _ in tools}) == 1 and len({bottom for _, _, bottom in tools}) == 1, (
                theme,
                name,
                tools,
            )
            browser.save_screenshot(str(screenshots / f"change-view-{name}-{theme}.png"))
    browser.execute_script("localStorage.removeItem('theme')")


@pytest.mark.django_db(transaction=True)
def test_operator_runs_pauses_and_unpauses_a_schedule(browser, live_server, screenshots, settings):
    from datetime import UTC, datetime

    from selenium.webdriver.common.by import By

    from django_jobruns import schedules
    from django_jobruns.models import JobSchedule

    settings.JOBRUNS = {
        "SCHEDULES": {
            "nightly-catalog": {
                "job": "demo.import_catalog",
                "cron": "0 3 * * *",
                "timezone": "Europe/Paris",
                "instance": "all",
                "payload": {"supplier": 1},
            }
        }
    }
    schedules.forget_sync()
    schedules.sync(datetime.now(UTC))
    User.objects.create_superuser("admin", password="jobruns-demo")
    log_in(browser, live_server, "/admin/django_jobruns/jobschedule/")
    row = browser.find_element(By.CSS_SELECTOR, "#result_list tbody tr")
    assert "At 03:00 every day" in row.text and "Europe/Paris" in row.text
    browser.save_screenshot(str(screenshots / "schedules.png"))
    row.find_element(By.LINK_TEXT, "nightly-catalog").click()

    browser.find_element(By.ID, "jobruns-schedule-pause").click()
    success_says(browser, "Paused schedule nightly-catalog")
    assert JobSchedule.objects.get(name="nightly-catalog").paused_at is not None
    browser.find_element(By.ID, "jobruns-schedule-unpause").click()
    success_says(browser, "Unpaused schedule nightly-catalog")
    browser.find_element(By.ID, "jobruns-schedule-run_now").click()
    success_says(browser, "Started run")
    started = JobRun.objects.get(job="import_catalog", instance="all")
    assert JobSchedule.objects.get(name="nightly-catalog").last_run_id == started.pk
    schedules.forget_sync()
