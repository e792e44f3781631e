"""The console in a real browser (Debian's chromium, Playwright), on both dialects: log in, live
counts, filters, requeue and bulk actions through the procedures, the read-only role, escaping,
the same-origin check."""

from __future__ import annotations

import re
import time

from playwright.sync_api import expect

from tests.support.helpers import state_of

from .conftest import ADMIN, READER


def _failed_for_good(console, *names):
    """Publish one job per name with its callback broken, run them: PERMANENTLY_FAILED."""
    console.flaky.fail.update(names)
    ids = [console.queue.publish(name, {"n": i}) for i, name in enumerate(names)]
    console.queue.process()
    console.flaky.fail.clear()
    return ids


def test_login_is_required_and_counts_change_live_after_a_publish(pages, console, installed):
    anonymous = pages(None)  # (headless chromium cannot show the login prompt: ask as it would)
    response = anonymous.context.request.get(f"{console.url}/")
    assert response.status == 401
    assert response.headers["www-authenticate"].startswith("Basic")
    wrong = pages({"username": "ada", "password": "guess"}).context.request.get(f"{console.url}/jobs")
    assert wrong.status == 401

    page = pages(ADMIN)
    assert page.goto("/").status == 200
    expect(page.locator("header .who")).to_contain_text("ada")
    console.queue.publish("mail", {"to": "a@example.com"})
    ready = page.locator('#counts th[data-total="READY"]')
    # The first job may arrive before the page: wait for a stable count, then publish once more.
    expect(ready).to_have_text("1", timeout=15000)  # the first page of a cold browser on a busy host
    console.queue.publish("mail", {"to": "b@example.com"})
    console.queue.publish("mail", {"to": "c@example.com"})
    expect(ready).to_have_text("3", timeout=8000)  # no reload: the server-sent event refreshed it


def test_a_change_while_a_refresh_is_in_flight_is_shown_too(pages, console):
    """Jobs published while the page's refresh is on its way: the `change` they cause is queued
    behind that refresh and runs after it, instead of being dropped with the element it swapped."""
    console.queue.publish("mail", {"to": "a@example.com"})
    held = []

    def hold_the_first_refresh(route):
        if held:
            route.continue_()
            return
        held.append(route.fetch())  # the counts as they are now: one READY job
        console.queue.publish("mail", {"to": "b@example.com"})
        console.queue.publish("mail", {"to": "c@example.com"})
        # real: a slow response, while their `change` (NOTIFY, or the 2 s fingerprint poll)
        # reaches the page; the route handler cannot look into the page meanwhile
        time.sleep(3.5)
        route.fulfill(response=held[0])

    page = pages(ADMIN)
    page.route("**/fragments/overview", hold_the_first_refresh)
    assert page.goto("/").status == 200
    expect(page.locator('#counts th[data-total="READY"]')).to_have_text("3", timeout=15000)
    assert held, "the page never refreshed"


def test_filter_the_jobs_to_one_serial_group(pages, console):
    ours = [console.queue.publish("sync", [n], serial_group="east") for n in range(3)]
    console.queue.publish("sync", [9], serial_group="west")
    console.queue.publish("mail", {"to": "x@example.com"})
    page = pages(ADMIN)
    page.goto("/jobs")
    expect(page.locator("#jobs tr[data-id]")).to_have_count(5)
    page.fill("input[name=group]", "east")
    page.click("form.filter button[type=submit]")
    rows = page.locator("#jobs tr[data-id]")
    expect(rows).to_have_count(3)
    assert sorted(int(i) for i in rows.evaluate_all("rs => rs.map(r => r.dataset.id)")) == sorted(ours)
    page.goto("/groups?name=east")
    expect(page.locator("#groups tr")).to_have_count(2)  # the header and east
    expect(page.locator("#groups")).to_contain_text("nothing: the head is due")


def test_requeue_a_permanently_failed_job_and_see_it_run(pages, console, installed):
    (job,) = _failed_for_good(console, "charge")
    assert state_of(installed, job) == 5
    page = pages(ADMIN)
    page.goto(f"/jobs/{job}")
    expect(page.locator("h2")).to_contain_text("PERMANENTLY_FAILED")
    expect(page.locator("#error")).to_contain_text("charge is broken")
    page.click("#act-requeue")
    page.fill("#reason", "the gateway is fixed")
    page.click("#confirm")
    expect(page.locator("#result")).to_have_text("1 job(s) changed, 0 skipped.")
    assert state_of(installed, job) == 1
    page.goto(f"/jobs/{job}")  # who and why are in the job (when: its updated_at)
    expect(page.locator("#error")).to_have_text("Requeued: the gateway is fixed (by ada via bgq web)")
    console.queue.process()
    page.goto(f"/jobs/{job}")
    expect(page.locator("h2")).to_contain_text("FINISHED")
    assert "charge" in console.flaky.ran


def test_bulk_requeue_by_filter_changes_only_the_matching_jobs(pages, console, installed):
    charges = _failed_for_good(console, "charge", "charge", "charge")
    (mail,) = _failed_for_good(console, "mail")
    page = pages(ADMIN)
    page.goto("/failures?state=5&callback=charge")
    expect(page.locator("#jobs tr[data-id]")).to_have_count(3)
    page.click("#bulk-requeue")
    expect(page.locator("#count")).to_have_text("3")
    page.fill("#reason", "deploy 4711 fixed it")
    page.click("#confirm")
    expect(page.locator("#result")).to_have_text("3 job(s) changed, 0 skipped.")
    assert [state_of(installed, j) for j in charges] == [1, 1, 1]
    assert state_of(installed, mail) == 5


def test_bulk_run_now_clears_the_postponement_of_the_matching_jobs(pages, console, installed):
    later = [console.queue.publish("mail", {"n": n}, postpone_by=3_600_000) for n in range(2)]
    other = console.queue.publish("sync", [1], postpone_by=3_600_000)
    page = pages(ADMIN)
    page.goto("/failures?state=1&callback=mail")
    page.click("#bulk-run_now")
    expect(page.locator("#count")).to_have_text("2")
    page.fill("#reason", "the campaign starts now")
    page.click("#confirm")
    expect(page.locator("#result")).to_have_text("2 job(s) changed, 0 skipped.")
    rows = [console.queue.get_job(j) for j in later]
    assert [r["postponed_by"] for r in rows] == [None, None]
    assert console.queue.get_job(other)["postponed_by"] == 3_600_000
    console.queue.process()
    assert [state_of(installed, j) for j in later] == [3, 3]
    assert state_of(installed, other) == 1


def test_the_read_only_role_sees_but_cannot_act(pages, console, installed):
    (job,) = _failed_for_good(console, "charge")
    page = pages(READER)
    page.goto(f"/jobs/{job}")
    expect(page.locator("header .who")).to_contain_text("(read-only)")
    expect(page.locator("#act-requeue")).to_have_count(0)
    page.goto("/failures")
    expect(page.locator("#bulk")).to_have_count(0)
    # A same-origin form POST from the reader's own page is refused all the same.
    status = page.evaluate(
        """async (id) => (await fetch('/actions/requeue', {method: 'POST',
             body: new URLSearchParams({id: id, confirm: 'yes', reason: 'try'})})).status""",
        job,
    )
    assert status == 403
    assert state_of(installed, job) == 5


def test_a_script_group_name_shows_as_text(pages, console):
    name = "<script>window.pwned = 1</script>"
    console.queue.publish("sync", [1], serial_group=name)
    page = pages(ADMIN)
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto("/groups")
    expect(page.locator("#groups td a").first).to_have_text(name)
    page.goto("/jobs")
    expect(page.locator("#jobs")).to_contain_text(name)
    assert page.evaluate("window.pwned") is None
    assert dialogs == []


def test_a_post_without_the_same_origin_header_is_refused(pages, console, installed):
    (job,) = _failed_for_good(console, "charge")
    page = pages(ADMIN)
    page.goto("/")
    form = {"id": str(job), "confirm": "yes", "reason": "cross-site"}
    bare = page.context.request.post(f"{console.url}/actions/requeue", form=form)
    assert bare.status == 403
    assert re.search("same-origin", bare.text())
    forged = page.context.request.post(
        f"{console.url}/actions/requeue", form=form, headers={"Origin": "http://evil.example"}
    )
    assert forged.status == 403
    assert state_of(installed, job) == 5


def test_bulk_cancel_by_filter_makes_only_the_matching_jobs_redundant_and_frees_their_group(
    pages, console, installed
):
    (broken,) = _failed_for_good(console, "charge")  # PERMANENTLY_FAILED: cancel leaves it alone
    hour = 3_600_000
    head = console.queue.publish("charge", [1], serial_group="east", postpone_by=hour)  # blocks east
    behind = console.queue.publish("mail", {"n": 1}, serial_group="east")
    loose = console.queue.publish("charge", [2], postpone_by=hour)
    other = console.queue.publish("sync", [3], postpone_by=hour)  # READY too, another callback
    console.queue.process()
    assert state_of(installed, behind) == 1  # waits behind its postponed head
    page = pages(ADMIN)
    page.goto("/failures?state=1,5&callback=charge")
    expect(page.locator("#jobs tr[data-id]")).to_have_count(3)
    page.click("#bulk-cancel")
    expect(page.locator("#count")).to_have_text("3")
    page.fill("#reason", "the customer left")
    page.click("#confirm")
    expect(page.locator("#result")).to_have_text("2 job(s) changed, 1 left alone, 0 skipped.")
    expect(page.locator("#outcome-cancelled")).to_contain_text(f"#{head}")
    expect(page.locator("#outcome-cancelled")).to_contain_text(f"#{loose}")
    expect(page.locator("#outcome-finished")).to_have_text(f"left alone (finished already): #{broken}")
    assert [state_of(installed, j) for j in (head, loose, broken, other, behind)] == [7, 7, 5, 1, 1]
    reason = "Cancelled: the customer left (by ada via bgq web)"
    assert console.queue.get_job(head)["error_message"] == reason
    page.goto(f"/jobs/{loose}")
    expect(page.locator("#error")).to_have_text(reason)
    console.queue.process()  # the group moved on: the job behind the cancelled head runs
    assert state_of(installed, behind) == 3
    assert state_of(installed, other) == 1


def test_pause_a_group_from_the_console_holds_it_until_resumed(pages, console, installed):
    page = pages(ADMIN)
    page.goto("/groups")
    page.fill("#pause-name", "east")
    page.click("#pause-group")
    page.fill("#reason", "the east warehouse moves")
    page.click("#confirm")
    expect(page.locator("#result")).to_have_text("group east paused.")
    (pause,) = console.queue.paused()
    assert (pause.kind, pause.name, pause.reason, pause.paused_by) == (
        "group", "east", "the east warehouse moves", "ada via bgq web",
    )  # fmt: skip
    east = console.queue.publish("sync", [1], serial_group="east")
    west = console.queue.publish("sync", [2], serial_group="west")
    console.queue.process()
    assert (state_of(installed, east), state_of(installed, west)) == (1, 3)
    page.goto("/groups")
    row = page.locator("#groups tr", has_text="east")
    expect(row).to_contain_text("paused group east")
    expect(row).to_contain_text("by ada via bgq web: the east warehouse moves")
    page.goto("/")
    expect(page.locator("#paused")).to_contain_text("group east")
    page.goto("/groups")
    row.locator("button.resume-group").click()
    page.fill("#reason", "the move is done")
    page.click("#confirm")
    expect(page.locator("#result")).to_have_text("group east resumed.")
    assert console.queue.paused() == []
    console.queue.process()
    assert state_of(installed, east) == 3


def test_the_workers_page_the_overview_and_a_job_name_the_worker(pages, console, installed):
    from bgq.model import WorkerMode
    from bgq.modes.registry import Registry

    page = pages(ADMIN)
    with Registry(console.queue, WorkerMode.WORK, "general") as registry:
        job = console.queue.publish("mail", {"to": "a@example.com"})
        console.queue.process()
        page.goto("/")
        expect(page.locator("#alive")).to_have_text("1")
        page.goto("/workers")
        row = page.locator(f"#worker-{registry.id}")
        expect(row).to_contain_text("work")
        expect(row).to_contain_text("alive")
        page.goto(f"/jobs/{job}")
        expect(page.locator("#worker")).to_contain_text(f"#{registry.id} work on ")
        worker_id = registry.id
    page.goto("/workers")
    expect(page.locator("#workers tr[data-id]")).to_have_count(0)
    page.goto(f"/jobs/{job}")
    expect(page.locator("#worker")).to_have_text(f"#{worker_id} (no longer registered)")
    page.goto("/")
    expect(page.locator("#alive")).to_have_text("0")
