"""The Airflow UI as a person uses it, in a real headless Chromium (tests/ui/browser.py) against a real
`airflow api-server` and scheduler (slotlake_dev.airflow_local.AirflowServers) with this repo's DAGs and plugin:

log in; the DAG list; the sync DAG's manual trigger (twice, around recorded changes); the slotlake view (slot state,
each gold table's applied LSN and version, the runs and their chart); the recovery DAG's Params form (a bad table, a
bad LSN and an impossible time are refused with the validation message, then a good form recovers both tables as of
an LSN); the replay DAG's Backfill dialog (one interval into a folder). Every run must succeed, and every output is
compared with PostgreSQL row by row: gold with the live tables, the recovered and replayed tables with the state
recorded at their LSN / interval end. A screenshot of each page is saved (tests/ui/browser.py: ARTIFACTS).
"""
from __future__ import annotations

import json
import secrets
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import yaml

from oracle import assert_gold_equals_pg
from pgclock import run_sql, server_now, sleep_past
from slotlake import delta_log
from slotlake.lake import LakePaths
from slotlake_dev.airflow_local import AirflowServers, free_port, local_airflow_env, migrate, run_airflow, server_env

from .browser import Screenshots, chromium, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow, pytest.mark.ui]

SOURCE = "shop"
TABLES = ["public.orders", "public.customers"]
SYNC, REPLAY, RECOVER, OPTIMIZE = (f"slotlake_{kind}__{SOURCE}" for kind in ("sync", "replay", "recover", "optimize"))


class Api:
    """The REST API of the running api-server, as the admin user (to wait for runs the browser started)."""

    def __init__(self, url: str, password: str) -> None:
        self.url = url
        req = urllib.request.Request(f"{url}/auth/token", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"username": "admin", "password": password}).encode())
        with urllib.request.urlopen(req, timeout=60) as r:
            self.token = json.load(r)["access_token"]

    def get(self, path: str) -> dict:
        req = urllib.request.Request(f"{self.url}{path}", headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)

    def runs(self, dag_id: str) -> list[dict]:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns?order_by=-run_after&limit=50")["dag_runs"]

    def wait_runs(self, dag_id: str, count: int, run_type: str, seconds: float = 900) -> list[dict]:
        """Until `dag_id` has `count` runs of `run_type` (manual, backfill), all successful; fails at once on a
        failed run of any type, naming it."""
        deadline = time.monotonic() + seconds
        while True:
            runs = self.runs(dag_id)
            failed = [r["dag_run_id"] for r in runs if r["state"] == "failed"]
            assert not failed, f"{dag_id}: run(s) failed: {failed}"
            ours = [r for r in runs if r["run_type"] == run_type]
            if len(ours) >= count and all(r["state"] == "success" for r in ours):
                return ours
            assert time.monotonic() < deadline, f"{dag_id}: no {count} good {run_type} run(s) in {seconds} s: {ours}"
            time.sleep(5)


@pytest.fixture
def airflow_ui(pg_db, tmp_path):
    """The source's tables with rows, the slotlake config (minute schedule: the replay DAG's intervals are minutes
    here), a migrated Airflow home with an admin password of this test only, and the servers running."""
    run_sql(pg_db,
         "CREATE TABLE orders (id int PRIMARY KEY, item text, qty int, price numeric(10,2))",
         "CREATE TABLE customers (id bigint PRIMARY KEY, name text)",
         "INSERT INTO orders SELECT g, 'item ' || g, g % 5, g * 1.5 FROM generate_series(1, 40) g",
         "INSERT INTO customers SELECT g, 'customer ' || g FROM generate_series(1, 10) g",
         "CREATE SCHEMA recorded")
    cfg_path = tmp_path / "slotlake.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "lake": str(tmp_path / "lake"),
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "sources": {SOURCE: {"dsn": pg_db, "tables": TABLES, "schedule": "* * * * *",
                             "start_date": datetime.now(UTC).strftime("%Y-%m-%d")}}}))
    home = tmp_path / "airflow"
    home.mkdir()
    password = secrets.token_urlsafe(12)
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    env = server_env(local_airflow_env(home, cfg_path), free_port())
    env.update({"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
                # The scheduler creates no cron runs: a DAG unpaused by the UI's trigger would otherwise run every
                # minute of the test (measured: 12-17 scheduled sync runs, five task processes each, beside the two
                # manual ones, which max_active_runs=1 queued behind them). Manual and backfill runs still run.
                "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False"})
    migrate(env)
    run_airflow(env, "dags", "reserialize")
    with AirflowServers(env) as servers:
        yield servers, password, LakePaths.of(str(tmp_path / "lake"), SOURCE), tmp_path


def _login(driver, url: str, password: str, shot: Screenshots) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url + "/")
    user = wait_for("the login form", lambda: driver.find_element(By.NAME, "username"), 120)
    shot("login")
    user.send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for("the home page after login", lambda: "/auth/login" not in driver.current_url, 60)


def _open_trigger(driver, url: str, dag_id: str):
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/dags/{dag_id}")
    wait_for(f"{dag_id}'s Trigger button",
             lambda: driver.find_element(By.CSS_SELECTOR, "[data-testid=trigger-dag-button]"), 60).click()
    return wait_for("the trigger dialog", lambda: driver.find_element(By.CSS_SELECTOR, "[role=dialog]"), 30)


# Sets a React-controlled field's value the way React sees a user's edit (the native setter, then an input event).
_SET_VALUE = """
const el = arguments[0];
const proto = el.tagName === 'TEXTAREA' ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
Object.getOwnPropertyDescriptor(proto, 'value').set.call(el, arguments[1]);
el.dispatchEvent(new Event('input', {bubbles: true}));
"""


def _fill(driver, field, text: str) -> None:
    """Replace a form field's text with `text`, typed as keys. Chromium's driver sometimes loses a key typed into
    the Airflow UI's React fields (the same one each time for a given text); then the field gets the text as one
    edit (an input event), and either way it must end up holding exactly `text`."""
    from selenium.webdriver.common.keys import Keys

    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.DELETE)
    field.send_keys(text)
    time.sleep(0.3)
    if field.get_attribute("value") != text:
        driver.execute_script(_SET_VALUE, field, text)
    wait_for(f"the field to hold {text!r}", lambda: field.get_attribute("value") == text, 10)


def _type(driver, element_id: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    _fill(driver, wait_for(f"the form field {element_id}", lambda: driver.find_element(By.ID, element_id), 30), text)


def _dialog_says(driver, text: str) -> str:
    """The error the trigger dialog shows under its form (the API's 400 answer) containing `text`, scrolled into
    view for the screenshot."""
    from selenium.webdriver.common.by import By

    def probe() -> str | None:
        for e in driver.find_elements(By.CSS_SELECTOR, "[role=alert], .chakra-alert__root, [data-part=description]"):
            if text in (e.text or ""):
                driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", e)
                return str(e.text)
        return None
    return wait_for(f"the form's validation message {text!r}", probe, 30)


def _click(driver, css: str, what: str, text: str | None = None) -> None:
    """Click the enabled button `css` (with `text`, if given). The error toast of a refused submit sits over the
    dialog's bottom-right corner, where its Trigger button is, and stays while the pointer is on it: a click that
    lands on the toast is sent to the button itself (a DOM click, as React handles a user's)."""
    from selenium.common.exceptions import ElementClickInterceptedException
    from selenium.webdriver.common.by import By

    def probe() -> bool:
        button = next(b for b in driver.find_elements(By.CSS_SELECTOR, css)
                      if (text is None or b.text.strip() == text) and b.is_enabled())
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
        try:
            button.click()
        except ElementClickInterceptedException:
            driver.execute_script("arguments[0].click()", button)
        return True
    wait_for(what, probe, 30)


def _trigger_sync(driver, api: Api, url: str, runs: int, shot: Screenshots, name: str) -> None:
    from selenium.webdriver.common.by import By

    _open_trigger(driver, url, SYNC)
    shot(f"{name}-trigger")
    _click(driver, "[data-testid=trigger-dag-submit]", "the Trigger button")
    api.wait_runs(SYNC, runs, "manual")
    driver.get(f"{url}/dags/{SYNC}/runs")
    wait_for("a successful manual run in the sync DAG's runs list", lambda: any(
        "Manual" in row.text and "Success" in row.text for row in driver.find_elements(By.CSS_SELECTOR, "tr")), 60)
    shot(f"{name}-runs")


@pytest.mark.timeout(2700)
def test_a_person_syncs_watches_recovers_and_backfills_in_the_airflow_ui(airflow_ui, pg_db):
    from selenium.webdriver.common.by import By

    servers, password, paths, tmp = airflow_ui
    url, api = servers.url, Api(servers.url, password)
    driver = chromium()
    shot = Screenshots(driver, "airflow_ui")
    try:
        # log in; the DAG list shows the source's four DAGs
        _login(driver, url, password, shot)
        driver.get(f"{url}/dags")
        wait_for("the four slotlake DAGs in the list", lambda: all(
            driver.find_elements(By.LINK_TEXT, d) for d in (SYNC, REPLAY, RECOVER, OPTIMIZE)), 60)
        shot("dag-list")

        # the sync DAG's manual trigger: the initial copy lands in gold
        _trigger_sync(driver, api, url, 1, shot, "sync-1")
        for t in TABLES:
            assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t)

        # changes inside one minute [b0, b0+1m): the replay interval; the state at its end is recorded, and the
        # LSN there is the recovery point; then more changes, and a second sync through the UI
        # (the current minute, when 20 s of it are left for the changes to commit inside it)
        now = server_now(pg_db)
        b0 = now.replace(second=0, microsecond=0)
        if (b0 + timedelta(minutes=1) - now).total_seconds() < 20:
            b0 += timedelta(minutes=1)
            sleep_past(pg_db, b0)
        run_sql(pg_db, "UPDATE orders SET qty = qty + 10 WHERE id % 3 = 0", "DELETE FROM orders WHERE id > 35",
             "INSERT INTO orders VALUES (100, 'new', 1, 9.99)", "UPDATE customers SET name = upper(name)")
        assert server_now(pg_db) < b0 + timedelta(minutes=1), "the changes ran past their minute"
        sleep_past(pg_db, b0 + timedelta(minutes=1))
        with psycopg.connect(pg_db, autocommit=True) as conn:
            point = str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])
            for t in TABLES:
                conn.execute(f"CREATE TABLE recorded.{t.split('.')[1]} AS TABLE {t}")
        run_sql(pg_db, "UPDATE orders SET price = 0 WHERE id < 5", "DELETE FROM customers WHERE id = 1",
             "INSERT INTO customers VALUES (50, 'late')")
        _trigger_sync(driver, api, url, 2, shot, "sync-2")
        marks = {}
        for t in TABLES:
            assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t)
            marks[t] = delta_log.latest_slotlake_commit(paths.gold(*t.split("."))).end_lsn

        # the recovery form: a table the source does not have, a bad LSN, an impossible time: each refused with
        # the validation message, no run created; then the good form recovers both tables as of `point`
        _open_trigger(driver, url, RECOVER)
        _type(driver, "element_tables", "public.orders\npublic.nope")
        _type(driver, "element_as_of", point)
        _type(driver, "element_destination", str(tmp / "recovered"))
        shot("recover-form")
        _click(driver, "[data-testid=trigger-dag-submit]", "the Trigger button")
        assert "public.nope" in _dialog_says(driver, "Invalid input for param tables")
        shot("recover-bad-table")
        _type(driver, "element_tables", "\n".join(TABLES))
        for kind, bad in (("lsn", "16-B374D848"), ("time", "2026-11-25T25:61")):
            _type(driver, "element_as_of", bad)
            _click(driver, "[data-testid=trigger-dag-submit]", "the Trigger button")
            # the message naming this value: the previous refusal's may still be on screen for a moment
            assert bad in _dialog_says(driver, f"Invalid input for param as_of: '{bad}'")
            shot(f"recover-bad-{kind}")
        assert api.runs(RECOVER) == []  # nothing was triggered by the refused forms
        _type(driver, "element_as_of", point)
        _click(driver, "[data-testid=trigger-dag-submit]", "the Trigger button")
        api.wait_runs(RECOVER, 1, "manual")
        driver.get(f"{url}/dags/{RECOVER}/runs")
        time.sleep(2)
        shot("recover-runs")
        for t in TABLES:
            schema, name = t.split(".")
            assert_gold_equals_pg(str(tmp / "recovered" / schema / name), pg_db, f"recorded.{name}")

        # the replay DAG's Backfill dialog: the one interval [b0, b0+1m) into a folder
        _open_trigger(driver, url, REPLAY)
        wait_for("the Backfill choice", lambda: driver.find_element(
            By.CSS_SELECTOR, "input[id$='radio:input:backfill']").find_element(By.XPATH, "..")).click()
        pickers = wait_for("the date range pickers", lambda: len(
            e := driver.find_elements(By.CSS_SELECTOR, "[data-testid=datetime-input]")) == 2 and e, 30)
        popovers = "[data-scope=popover][data-part=content]"
        for picker in pickers:
            # The previous picker's popover may still be on screen while it closes (slow on a loaded machine):
            # typing into it fails, so wait until none shows, then for the one this click opens.
            wait_for("the previous date picker to close", lambda: not any(
                p.is_displayed() for p in driver.find_elements(By.CSS_SELECTOR, popovers)), 30)
            picker.click()

            def inputs():  # inside the probe, so a popover replaced meanwhile (a stale element) is looked up again
                shown = [p for p in driver.find_elements(By.CSS_SELECTOR, popovers) if p.is_displayed()]
                return len(shown) == 1 and [shown[0].find_element(By.CSS_SELECTOR, f"input[placeholder='{ph}']")
                                            for ph in ("YYYY/MM/DD", "HH:mm")]

            day, clock = wait_for("the date picker's date and time fields", inputs, 30)
            for field, value in ((day, b0.strftime("%Y/%m/%d")), (clock, b0.strftime("%H:%M"))):
                _fill(driver, field, value)
            driver.find_element(By.XPATH, "//*[text()='Date Range']").click()  # closes the picker
        # the replay task depends on its past run, so Airflow asks for a reprocess behaviour that reruns runs
        wait_for("the All Runs choice", lambda: driver.find_element(
            By.CSS_SELECTOR, "input[id$='radio:input:completed']").find_element(By.XPATH, "..")).click()
        # Airflow 3.3's Backfill dialog sends its Run Parameters only with this box ticked (else the runs get none)
        driver.find_element(By.XPATH, "//*[@role='dialog']//label[contains(., 'Override parameters')]").click()
        _type(driver, "element_dest", str(tmp / "replayed"))
        shot("backfill-form")
        _click(driver, "[role=dialog] button", "the Run Backfill button", "Run Backfill")
        runs = api.wait_runs(REPLAY, 1, "backfill")
        assert len(runs) == 1, runs
        assert runs[0]["logical_date"].startswith(b0.strftime("%Y-%m-%dT%H:%M")), runs
        driver.get(f"{url}/dags/{REPLAY}/runs")
        time.sleep(2)
        shot("backfill-runs")
        end = (b0 + timedelta(minutes=1)).strftime("%Y%m%dT%H%M%SZ")
        for t in TABLES:
            schema, name = t.split(".")
            assert_gold_equals_pg(str(tmp / "replayed" / end / schema / name), pg_db, f"recorded.{name}")
        # the slotlake view (after the recovery and backfill: they leave gold and the slot as the second sync did),
        # embedded in the Airflow UI from its nav, and on its own
        driver.get(f"{url}/")
        link = wait_for("the slotlake entry in the nav", lambda: next(
            e for e in driver.find_elements(By.CSS_SELECTOR, "nav a, nav button, a, button")
            if e.text.strip().lower() == "slotlake"), 60)
        link.click()
        frame = wait_for("the slotlake view's frame", lambda: driver.find_element(By.TAG_NAME, "iframe"), 60)
        driver.switch_to.frame(frame)
        body = wait_for("the slotlake view's content", lambda: (
            t := driver.find_element(By.TAG_NAME, "body").text) and SOURCE in t and t, 60)
        driver.switch_to.default_content()
        shot("slotlake-view-in-airflow")
        for t, mark in marks.items():
            assert t in body and mark in body, (t, mark, body[:3000])
        assert f"slotlake_{SOURCE}" in body, body[:3000]  # the slot
        driver.get(f"{url}/slotlake/")
        wait_for("the slotlake page", lambda: SOURCE in driver.find_element(By.TAG_NAME, "body").text, 60)
        assert driver.find_elements(By.CSS_SELECTOR, "svg"), "the runs chart is missing"
        shot("slotlake-view")
    except BaseException:
        shot("failure")
        raise
    finally:
        driver.quit()

