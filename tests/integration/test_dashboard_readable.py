"""What atk61-29a found on the dashboard pages (Debian's chromium driven by Playwright, a real
`gpuledger serve`): a decision's record shown raw (F2), a bad value in a page's address
replacing the page (F3), a revoked token's tab kept until its next read (F4), pages wider than
a 1,024 px or 768 px window (F1), the whole period's preemptions starting at "—" (F5), a what-if
on no account refused 403 with its name cut (F6), and no job's name on any page (F7)."""

from __future__ import annotations

import json
import re

from playwright.sync_api import Browser, Page

from tests.integration.serverkit import cli, make_token
from tests.integration.test_dashboard import (
    READY,
    Served,
    browser,
    served,
    signed_in,
    tabs_closed,
    visit,
    watched,
)

__all__ = ["browser", "served", "tabs_closed"]  # the fixtures, shared

EPOCH = re.compile(r"\b1\d{9}(\.\d+)?\b")
"""A time in epoch seconds (2001-2033), as raw JSON shows it."""


def latest_decision(s: Served) -> int:
    status, body = s.server.request("GET", "/ui/api/decisions?limit=1", token=s.tokens["root"])
    assert status == 200 and body["rows"], body
    return int(body["rows"][0]["position"])


def test_a_decisions_record_names_its_fields_and_shows_its_times_in_the_pages_form(
    served: Served, browser: Browser
) -> None:
    """F2: "The record" was the event's raw JSON: `"real_actor": null`, `"at": 1796618587.9`."""
    s = served
    position = latest_decision(s)
    page, errors = visit(s, browser, f"/ui/decisions?position={position}", "#decision")
    assert page.locator("#decision-record").count() == 1, page.locator("#decision").inner_text()
    text = page.locator("#decision").inner_text()
    for word in ("null", "undefined", "NaN"):
        assert not re.search(rf"\b{word}\b", text), (word, text)
    assert not EPOCH.search(text), EPOCH.search(text)
    fields = [
        c.inner_text() for c in page.locator("#decision-record tbody tr td:first-child").all()
    ]
    assert {"at", "cycle_id", "based_on", "waiting.considered"} <= set(fields), fields
    times = page.locator("#decision-record time").all()
    assert times and all((t.get_attribute("title") or "").endswith("(UTC)") for t in times)
    assert errors == []


def test_the_decisions_summary_and_a_jobs_labels_are_no_raw_json(
    served: Served, browser: Browser
) -> None:
    """atk61-29c F5: the summary's "policy" row was `fairshare-7 {"version":...}`
    (JSON.stringify), and the job page showed `Labels {}`."""
    s = served
    position = latest_decision(s)
    page, errors = visit(s, browser, f"/ui/decisions?position={position}", "#decision")
    summary = page.locator("#decision table").first.inner_text()
    assert "{" not in summary and '"' not in summary, summary
    assert "policy.version" in page.locator("#decision-record").inner_text()
    job = s.dash.job_b
    page.goto(f"{s.server.url}/ui/job?id={job}")
    page.wait_for_selector("#job-labels", timeout=20_000)
    text = page.locator("#job-private").inner_text()
    assert "{" not in text and "}" not in text, text
    assert errors == []


BAD = [
    ("queue", "sort=bogus", "sort", "bogus"),
    ("queue", "state=bogus", "state", "bogus"),
    ("queue", "reason=NOPE", "reason", "NOPE"),
    ("queue", "account=nope", "account", "nope"),
    ("finished", "reason=bogus", "reason", "bogus"),
    ("finished", "account=nope", "account", "nope"),
]


def test_a_bad_value_in_a_pages_address_is_dropped_and_said_beside_the_filters(
    served: Served, browser: Browser
) -> None:
    """F3: the page was replaced by one error line (no filters, headers or pager)."""
    s = served
    page, errors = watched(signed_in(browser, s.tokens["root"]))
    for name, query, param, value in BAD:
        page.goto(f"{s.server.url}/ui/{name}?{query}&limit=20")
        page.wait_for_selector(f"#{name} thead th, #page-error", timeout=20_000)
        assert page.locator("#page-error").count() == 0, (query, page.locator("main").inner_text())
        said = page.locator("#filters #filter-error").inner_text()
        assert f"{param}={value}" in said and "dropped" in said, (query, said)
        assert page.locator("#f-user").count() == 1 and page.locator("#queue-range").count() == 1
        assert page.locator(f"#{name} tbody tr").count() > 0, query
        if name == "queue":  # the address kept no bad value
            page.wait_for_function(f"!location.search.includes({json.dumps(value)})")
            assert page.locator("#queue-range").get_attribute("data-total") != "0"
    # changing a filter ends the line
    page.goto(f"{s.server.url}/ui/queue?sort=bogus")
    page.wait_for_selector("#filter-error")
    page.select_option("#f-state", "all")
    page.wait_for_selector("#filter-error", state="detached")
    # the API names the refused parameter
    for query, param in (("state=bogus", "state"), ("sort=x", "sort"), ("account=nope", "account")):
        status, body = s.server.request("GET", f"/ui/api/queue?{query}", token=s.tokens["root"])
        assert status in (400, 404) and body["param"] == param, (query, status, body)
    assert errors == [] or all("40" in e for e in errors), errors  # (the refused reads)


LONG = "A" * 1025
MORE_BAD = [  # (address, what shows when drawn, words said beside the filters)
    (f"queue?account={LONG}&limit=20", "#queue thead th", ["account=AAAA", "1,025 characters"]),
    (f"finished?reason={LONG}&limit=20", "#finished thead th", ["reason=AAAA", "dropped"]),
    ("budget?account=nope", "#budget thead th", ["account=nope dropped"]),
    ("preemptions?account=nope", "#preemptions thead th", ["account=nope dropped"]),
    ("preemptions?side=bogus&window=bogus", "#preemptions thead th",
     ["side=bogus dropped", "window=bogus dropped"]),
]  # fmt: skip


def test_more_bad_addresses_keep_the_page_and_say_what_was_dropped(
    served: Served, browser: Browser
) -> None:
    """atk61-29c F4: a value over 1,024 characters was a raw 400 JSON from the page route;
    `/ui/budget?account=nope` and `/ui/preemptions?account=nope` only an error line; a bad
    side or window on Preemptions and a bad position on Decisions dropped without a word."""
    s = served
    page, errors = watched(signed_in(browser, s.tokens["root"]))
    for address, drawn, words in MORE_BAD:
        page.goto(f"{s.server.url}/ui/{address}")
        page.wait_for_selector(f"{drawn}, #page-error", timeout=20_000)
        assert page.locator("#page-error").count() == 0, (
            address,
            page.locator("main").inner_text(),
        )
        said = page.locator("#filter-error").inner_text()
        assert all(w in said for w in words) and LONG not in said, (address, said)
    for position in ("-1", "abc", "1e3"):
        page.goto(f"{s.server.url}/ui/decisions?position={position}")
        page.wait_for_selector("#decisions thead th", timeout=20_000)
        said = page.locator("#decision-error").inner_text()
        assert f"position={position} dropped" in said, (position, said)
    assert errors == [] or all("40" in e for e in errors), errors  # (the refused reads)


def test_a_revoked_tokens_tab_signs_out_at_its_next_look_not_its_next_read(
    served: Served, browser: Browser
) -> None:
    """F4: Teams (read every 30 s) kept its data 20-25 s after its token was revoked, its 2 s
    look already answered 401."""
    s = served
    secret = make_token(s.dash.home, "--user", s.dash.user_a)
    page, _ = watched(signed_in(browser, secret))
    page.goto(f"{s.server.url}/ui/teams")
    page.wait_for_selector(READY["teams"])
    page.wait_for_function("/^updated /.test(document.getElementById('status').textContent)")
    revoke = {"actor": "", "token_id": secret.split("_")[1]}
    status, body = s.server.request(
        "POST", "/v1/commands/token.revoke", revoke, token=s.tokens["root"]
    )
    assert status == 200, body
    # (the token is removed, then put back by `signed_in`'s script on the login page's load)
    page.wait_for_url(re.compile(r"/ui/login\?next="), timeout=8_000)


PAGES = {
    "teams": READY["teams"],
    "queue": READY["queue"],
    "queue?state=running": READY["queue"],
    "finished": "#finished tbody tr",
    "nodes": READY["nodes"],
    "decisions": READY["decisions"],
    "preemptions?account=*&window=all": "#preempt-summary",
    "budget": "#budget tbody tr",
}


def fits(page: Page) -> dict[str, float]:
    """The document's width and `main`'s content width against the window's."""
    out: dict[str, float] = page.evaluate(
        "() => ({ window: innerWidth, document: document.documentElement.scrollWidth,"
        " main: document.getElementById('main').scrollWidth,"
        " mainBox: document.getElementById('main').clientWidth,"
        " signout: document.getElementById('signout').getBoundingClientRect().right })"
    )
    return out


def test_every_page_fits_a_1024_px_window_and_the_menu_wraps_at_768_px(
    served: Served, browser: Browser
) -> None:
    """F1: at 1,024 px the Queue table was 1,180 px in `main`'s sideways scroll and the Budget's
    "what if…" off the screen; at 768 px the menu did not wrap ("Sign out" off the screen)."""
    s = served
    job = s.dash.job_b
    ctx = signed_in(browser, s.tokens["root"])
    page, errors = watched(ctx)
    for width in (1024, 768):
        page.set_viewport_size({"width": width, "height": 800})
        for path, ready in {**PAGES, f"job?id={job}": "#job-facts"}.items():
            page.goto(f"{s.server.url}/ui/{path}")
            page.wait_for_selector(ready)
            got = fits(page)
            assert got["document"] <= width and got["main"] <= got["mainBox"], (width, path, got)
            assert got["signout"] <= width, (width, path, got)
        page.goto(f"{s.server.url}/ui/budget")
        page.wait_for_selector("#budget tbody tr")
        right = page.locator("button.whatif").first.bounding_box()
        assert right is not None and right["x"] + right["width"] <= width, (width, right)
    assert errors == []


def test_the_whole_periods_preemptions_say_from_the_logs_start(
    served: Served, browser: Browser
) -> None:
    """F5: "every team, — – Dec 7, 01:17: suffered 31, caused 18"."""
    page, errors = visit(
        served, browser, "/ui/preemptions?account=*&window=all", "#preempt-summary"
    )
    summary = page.locator("#preempt-summary").inner_text()
    assert "—" not in summary and "from the log's start to " in summary, summary
    assert errors == []


def test_a_whatif_on_no_account_is_a_404_with_its_whole_name(served: Served) -> None:
    """F6: 403 "… it needs a manager of '<b>x<' or an admin" (cut at the '/' in its name)."""
    s = served
    name = "<b>x</b>"
    for who in ("boss", "root"):
        status, body = s.server.request(
            "POST", "/ui/api/budget/whatif", {"account": name, "shares": 1}, token=s.tokens[who]
        )
        assert status == 404 and body["detail"].startswith(f"no account {name!r}"), (who, body)
    # a plain member may ask no what-if at all: refused, the name not cut
    status, body = s.server.request(
        "POST", "/ui/api/budget/whatif", {"account": name, "shares": 1},
        token=s.tokens[s.dash.user_a],
    )  # fmt: skip
    assert status == 403 and "<b>x<'" not in body["detail"], body
    assert "may not ask a what-if" in body["detail"], body


HOSTILE = "<img src=x onerror=window.__x=1>\u202eevil" + "W" * 200
"""A job's name: markup, a right-to-left override, long (cut, whole on hover)."""


def test_a_jobs_name_shows_on_the_queue_finished_and_job_pages_escaped_and_cut(
    served: Served, browser: Browser
) -> None:
    """F7: `/ui/api/job/N` carried `job_name`, but no page showed it."""
    s = served
    out = cli(
        s.dash.home, "submit", "-A", s.dash.project_a, "-G", "8", "-J", HOSTILE,
        "--json", "--", "python", "named.py", GPULEDGER_USER=s.dash.user_a,
    )  # fmt: skip
    job = int(json.loads(out.stdout)["job_id"])
    page, errors = visit(s, browser, f"/ui/queue?user={s.dash.user_a}&state=all", READY["queue"])
    cell = page.locator(f"#queue tr[data-job='{job}'] [data-col=name]")
    assert cell.get_attribute("title") == HOSTILE
    box = cell.bounding_box()  # one line, cut to its cell
    assert box is not None and box["width"] < 100 and box["height"] < 20, box
    page.goto(f"{s.server.url}/ui/job?id={job}")
    page.wait_for_selector("#job-name")
    assert page.locator("#job-name").inner_text() == HOSTILE
    # cancelled (it waits behind the 8-GPU jobs `build` submits): the newest finished job
    cli(s.dash.home, "cancel", str(job), GPULEDGER_USER=s.dash.user_a)
    page.goto(f"{s.server.url}/ui/finished?user={s.dash.user_a}")
    got = page.locator(f"#finished tr[data-job='{job}'] [data-col=name]")
    got.wait_for()
    assert got.get_attribute("title") == HOSTILE
    assert page.evaluate("window.__x") is None  # the markup never ran
    assert errors == []


def test_the_queue_at_1024_px_keeps_its_codes_whole_and_reasons_to_two_lines(
    served: Served, browser: Browser
) -> None:
    """atk61-29c F6: at 1,024 px the code column showed `WAIT_RESOUR…` and the reason wrapped
    to 5-7 lines (a row ~145 px tall, 4 jobs a screen)."""
    s = served
    page, errors = watched(signed_in(browser, s.tokens["root"]))
    page.set_viewport_size({"width": 1024, "height": 800})
    page.goto(f"{s.server.url}/ui/queue")
    page.wait_for_selector("#queue tbody tr [data-col=reason] .clamp")
    cells = page.evaluate(
        "() => [...document.querySelectorAll('#queue tbody tr')].map((tr) => {"
        " const code = tr.querySelector('[data-col=code]'), why = tr.querySelector('.clamp');"
        " const line = parseFloat(getComputedStyle(why).lineHeight) || 18;"
        " return { cut: code.scrollWidth > code.clientWidth + 1, code: code.textContent,"
        " lines: why.getBoundingClientRect().height / line, title: why.title,"
        " text: why.textContent }; })"
    )
    assert cells, "no queued job"
    for c in cells:
        assert not c["cut"], c
        assert c["lines"] <= 2.2, c
    assert any(c["title"] for c in cells), cells  # a waiting job's whole reason, on hover
    assert errors == []
