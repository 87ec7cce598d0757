"""The Budget review page while a what-if runs (Debian's chromium driven by Playwright, a real
`gpuledger serve`): a manager looking at another child meanwhile sees whose what-if runs, and
the result stays with the child it was asked for."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import threading
import time
from typing import Any

from playwright.sync_api import Browser, Page

from tests.integration.serverkit import start_server
from tests.integration.test_dashboard import (
    beside_her_other_browser,
    browser,
    signed_in,
    tabs_closed,
    watched,
)
from tests.integration.test_dashboard_whatif import (
    SLOW_S,
    Reviewed,
    _until_child,
    ask,
    children,
    reviewed,
)

__all__ = ["browser", "reviewed", "tabs_closed"]  # the fixtures, shared


def test_another_childs_what_if_meanwhile_names_the_one_running_and_keeps_its_result(
    reviewed: Reviewed, browser: Browser
) -> None:
    """atk52-29 F1: a second child's "what if…" while the first's what-if ran showed the first's
    progress under the second's heading ("What if B held other shares?" over "Waiting for 1
    what-if ahead of yours"), and the first's result, when it came, was shown under neither:
    lost. Now the second's panel names whose what-if runs (its Run button waits: one of a
    person's at a time), and the result shows under the first's heading when it is chosen
    again."""
    r = reviewed
    first, second = sorted(children(r))[:2]
    # root's what-if runs first, so boss's waits its turn: the page is used while hers is asked
    ahead: list[tuple[int, Any]] = []
    root = threading.Thread(
        target=lambda: ahead.append(ask(r, r.tokens["root"], {"account": first, "shares": 3}))
    )
    root.start()
    _until_child(r)
    page, errors = watched(signed_in(browser, r.tokens["boss"]))
    page.goto(r.server.url + "/ui/budget")
    page.wait_for_selector("#budget tbody tr")
    page.locator(f'#budget tbody tr[data-account="{first}"] button.whatif').click()
    page.fill("#whatif-shares", "7")
    page.click("#whatif-run")
    page.wait_for_selector("#whatif-running")
    page.locator(f'#budget tbody tr[data-account="{second}"] button.whatif').click()
    page.wait_for_function(
        "(a) => (document.querySelector('#whatif h3') || {}).textContent?.includes(a)", arg=second
    )
    line = page.locator("#whatif-running").inner_text()
    assert first in line, line  # whose what-if it is, under the other child's heading
    assert page.locator("#whatif-run").is_disabled()  # hers runs: one of a person's at a time
    page.wait_for_function(  # hers ended
        "!document.querySelector('#whatif-running')", timeout=SLOW_S * 1000
    )
    root.join(SLOW_S)
    assert [s for s, _ in ahead] == [200], ahead
    assert second in page.locator("#whatif h3").inner_text()
    assert page.locator("#whatif-result").count() == 0  # not under the second's heading
    page.locator(f'#budget tbody tr[data-account="{first}"] button.whatif').click()
    page.wait_for_selector("#whatif-result", timeout=10_000)
    assert first in page.locator("#whatif h3").inner_text()
    assert page.locator("#whatif-result").get_attribute("data-shares") == "7"
    assert page.locator("#whatif-error").count() == 0 and errors == [], errors


def test_a_second_tab_shows_the_what_if_the_first_asked_and_waits_for_its_end(
    reviewed: Reviewed, browser: Browser
) -> None:
    """atk53-29 F6: a second tab of the same person knew nothing of the what-if her first tab
    asked: no line said one ran, and its Run answered 429 "a what-if of yours is under way".
    Now it shows hers where it stands (`GET /ui/api/budget/whatif/turn` names its account and
    shares), its Run waits for its end, and then it says the result shows in the first tab."""
    r = reviewed
    kids = children(r)
    first, second = sorted(kids)[:2]
    now = kids[first]["raw_shares"]  # (a change of nothing is answered at once: no child)
    root_asks, hers = {"account": first, "shares": now + 2}, str(now + 3)
    ahead: list[tuple[int, Any]] = []  # root's runs first: boss's waits its turn, then runs
    root = threading.Thread(target=lambda: ahead.append(ask(r, r.tokens["root"], root_asks)))
    root.start()
    _until_child(r)
    one, errors_one = watched(signed_in(browser, r.tokens["boss"]))
    one.goto(r.server.url + "/ui/budget")
    one.wait_for_selector("#budget tbody tr")
    one.locator(f'#budget tbody tr[data-account="{first}"] button.whatif').click()
    one.fill("#whatif-shares", hers)
    one.click("#whatif-run")
    one.wait_for_selector("#whatif-running")
    two, errors_two = watched(signed_in(browser, r.tokens["boss"]))
    two.goto(r.server.url + "/ui/budget")
    two.wait_for_selector("#budget tbody tr")
    two.locator(f'#budget tbody tr[data-account="{second}"] button.whatif').click()
    two.wait_for_selector("#whatif-running", timeout=10_000)  # before: never shown
    line = two.locator("#whatif-running").inner_text()
    assert first in line and f"shares {hers}" in line and "another tab" in line, line
    assert two.locator("#whatif-run").is_disabled()
    two.wait_for_selector("#whatif-elsewhere", timeout=SLOW_S * 1000)  # hers ended
    assert first in two.locator("#whatif-elsewhere").inner_text()
    assert two.locator("#whatif-running").count() == 0
    assert not two.locator("#whatif-run").is_disabled()
    one.wait_for_selector("#whatif-result", timeout=SLOW_S * 1000)  # the first tab has it
    assert one.locator("#whatif-result").get_attribute("data-shares") == hers
    root.join(SLOW_S)
    assert [s for s, _ in ahead] == [200], ahead
    # (`one` and `two` are two browsers of hers: a 429 between them is the rule, asked again)
    errors_one, errors_two = (
        beside_her_other_browser(errors_one),
        beside_her_other_browser(errors_two),
    )
    assert two.locator("#whatif-error").count() == 0 and errors_one == errors_two == [], (
        errors_one,
        errors_two,
    )


def test_a_tab_open_before_her_what_if_starts_shows_it_at_once_and_a_failure_as_one(
    reviewed: Reviewed, browser: Browser
) -> None:
    """atk54-29 F3: a tab of hers already on the Budget page learnt of the what-if another tab
    of the same browser started only at its next 30 s redraw (its Run answered 429 meanwhile);
    F4: when that what-if failed, the tab said its result showed in the other tab. Tabs of one
    browser now hear a start and an end at once (a BroadcastChannel), and the end says how."""
    r = reviewed
    kids = children(r)
    first, second = sorted(kids)[:2]
    ctx = signed_in(browser, r.tokens["boss"])
    two, errors_two = watched(ctx)  # open first, its panel on another child
    two.goto(r.server.url + "/ui/budget")
    two.wait_for_selector("#budget tbody tr")
    two.locator(f'#budget tbody tr[data-account="{second}"] button.whatif').click()
    one, errors_one = watched(ctx)
    one.goto(r.server.url + "/ui/budget")
    one.wait_for_selector("#budget tbody tr")
    one.locator(f'#budget tbody tr[data-account="{first}"] button.whatif').click()
    one.fill("#whatif-shares", str(kids[first]["raw_shares"] + 4))
    one.click("#whatif-run")
    one.wait_for_selector("#whatif-running")
    two.wait_for_selector("#whatif-running", timeout=8_000)  # before: up to 30 s
    assert "another tab" in two.locator("#whatif-running").inner_text()
    assert two.locator("#whatif-run").is_disabled()
    two.wait_for_selector("#whatif-elsewhere", timeout=SLOW_S * 1000)
    one.wait_for_selector("#whatif-result, #whatif-error", timeout=SLOW_S * 1000)
    ended = two.locator("#whatif-elsewhere").inner_text()
    if one.locator("#whatif-error").count():
        assert "it failed" in ended, ended
    else:
        assert "its result shows" in ended and "error" not in ended, ended
    assert errors_one == errors_two == [], (errors_one, errors_two)


def _held_ahead(r: Reviewed, account: str) -> tuple[threading.Thread, list[int]]:
    """Root's what-if of `account` running, its child held (SIGSTOP): boss's next waits in line
    for as long as the test needs (the test history's what-if takes seconds)."""
    ahead: list[Any] = []

    def asking() -> None:  # (a killed server answers nothing)
        with contextlib.suppress(OSError, http.client.HTTPException):
            ahead.append(ask(r, r.tokens["root"], {"account": account, "shares": 3}))

    root = threading.Thread(target=asking, daemon=True)
    root.start()
    held = _until_child(r)
    for p in held:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGSTOP)
    return root, held


def _go_on(held: list[int]) -> None:
    for p in held:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGCONT)


def _budget(browser: Browser, r: Reviewed, account: str) -> tuple[Page, list[str]]:
    """Boss's Budget page in a browser of its own, the what-if panel of `account` open."""
    page, errors = watched(signed_in(browser, r.tokens["boss"]))
    page.goto(r.server.url + "/ui/budget")
    page.wait_for_selector("#budget tbody tr")
    page.locator(f'#budget tbody tr[data-account="{account}"] button.whatif').click()
    return page, errors


def test_another_browser_of_hers_learns_of_her_what_if_within_seconds(
    reviewed: Reviewed, browser: Browser
) -> None:
    """atk54-29 F3: another browser of the same person (her laptop and her desktop) learnt of
    the what-if she asked only at its next 30 s redraw of the Budget page, or when its Run was
    refused. Now the page asks where hers stands every few seconds while it is in view (the
    turn route: her own what-if alone)."""
    r = reviewed
    kids = children(r)
    first, second = sorted(kids)[:2]
    two, errors_two = _budget(browser, r, second)  # open before hers is asked
    two.wait_for_selector("#whatif")
    root, held = _held_ahead(r, first)
    try:
        two.wait_for_timeout(4_000)  # more than a look at her turn: root's is none of hers
        assert two.locator("#whatif-running").count() == 0
        one, errors_one = _budget(browser, r, first)
        one.fill("#whatif-shares", str(kids[first]["raw_shares"] + 5))
        one.click("#whatif-run")
        one.wait_for_selector("#whatif-running")
        two.wait_for_selector("#whatif-running", timeout=8_000)  # before: up to 30 s
        assert first in two.locator("#whatif-running").inner_text()
        assert two.locator("#whatif-run").is_disabled()
    finally:
        _go_on(held)
    two.wait_for_selector("#whatif-elsewhere", timeout=SLOW_S * 1000)
    assert not two.locator("#whatif-run").is_disabled()
    one.wait_for_selector("#whatif-result", timeout=SLOW_S * 1000)
    root.join(SLOW_S)
    # two browsers of hers, both redrawn as hers ends: a 429 between them is the rule, asked
    # again (s57-tabs's loaded run, load ~20: one in `two`'s console)
    errors_one, errors_two = (
        beside_her_other_browser(errors_one),
        beside_her_other_browser(errors_two),
    )
    assert errors_one == errors_two == [], (errors_one, errors_two)


HIDEABLE = (
    "window.__shown = true;"
    "Object.defineProperty(document, 'visibilityState',"
    " {get: () => window.__shown ? 'visible' : 'hidden'});"
    "Object.defineProperty(document, 'hidden', {get: () => !window.__shown});"
)
"""A page whose visibility the test sets (`_show`): a hidden tab, or one in a window behind."""


def _show(page: Page, shown: bool) -> None:
    page.evaluate(
        "(s) => { window.__shown = s; document.dispatchEvent(new Event('visibilitychange')); }",
        shown,
    )


def _state(page: Page) -> dict[str, Any]:
    """Which of the what-if panel's lines show, and whether its Run waits."""
    got: dict[str, Any] = page.evaluate(
        """() => { const has = (i) => !!document.getElementById(i);
          const run = document.getElementById('whatif-run');
          return {running: has('whatif-running'), silent: has('whatif-silent'),
                  lost: has('whatif-lost'), ended: has('whatif-elsewhere'),
                  disabled: run ? run.disabled : null}; }"""
    )
    return got


def _ask(one: Page, shares: int) -> None:
    """Boss's what-if asked in `one` (its panel open), waiting its turn (root's held ahead:
    `_held_ahead`), its place in line streamed: the server has it."""
    one.fill("#whatif-shares", str(shares))
    one.click("#whatif-run")
    one.wait_for_selector("#whatif-running")
    one.wait_for_function(
        "/Waiting for 1 what-if/.test(document.querySelector('#whatif-running').textContent)"
    )


def _opened(page: Page, r: Reviewed, account: str) -> Page:
    page.goto(r.server.url + "/ui/budget")
    page.wait_for_selector("#budget tbody tr")
    page.locator(f'#budget tbody tr[data-account="{account}"] button.whatif').click()
    return page


def test_a_server_killed_mid_what_if_says_it_lost_hers_in_every_tab_and_gives_run_back(
    reviewed: Reviewed, browser: Browser
) -> None:
    """atk54-29 F5: after kill -9 of the server, every tab of hers said her what-if ran on,
    its Run disabled, for good. Now each says in one line that it was lost with the server, and
    Run is back: the asking tab when its stream breaks, a second tab of its browser when that
    tab tells it. atk55-29 F1: a tab of another browser that made no look while the server was
    down (hidden, asleep, or an 11 s gap between two looks) said, once the server was started
    again, that hers "has ended: its result shows in that tab". The turn route names hers by a
    number in the server's start now, and a tab that saw it under one start and finds another
    says it was lost. F2: a tab of another browser said "lost" at its first failed look; now it
    says the server is not answering until it answers (the restart: lost) or 60 s pass. (The
    server is started again on its port, as systemd would, for the pages and the next tests.)"""
    r = reviewed
    kids = children(r)
    first, second = sorted(kids)[:2]
    port = r.server.port
    root, held = _held_ahead(r, first)
    try:
        one, errors_one = _budget(browser, r, first)  # (every tab open before hers is asked)
        three, errors_three = watched(one.context)
        _opened(three, r, second)
        other = signed_in(browser, r.tokens["boss"])  # another browser of hers, two tabs
        other.add_init_script(HIDEABLE)
        two, errors_two = watched(other)
        four, errors_four = watched(other)
        for page, account in ((two, second), (four, first)):
            _opened(page, r, account)
        _ask(one, kids[first]["raw_shares"] + 6)
        for page in (one, two, three, four):
            page.wait_for_selector("#whatif-running", timeout=10_000)
            assert page.locator("#whatif-run").is_disabled()
        _show(four, False)  # hidden across the kill and the restart: it makes no look
        r.server.stop(signal.SIGKILL)
    finally:
        _go_on(held)
    try:
        for page in (one, three):  # before: "running", Run disabled, minutes later
            page.wait_for_selector("#whatif-lost", timeout=15_000)
            line = page.locator("#whatif-lost").inner_text()
            assert first in line and "lost" in line and "\n" not in line, line
            assert page.locator("#whatif-running").count() == 0
            assert not page.locator("#whatif-run").is_disabled()
        two.wait_for_selector("#whatif-silent", timeout=20_000)  # its looks fail: not answering
        assert "not answering" in two.locator("#whatif-silent").inner_text()
        assert _state(two) == {"running": True, "silent": True, "lost": False, "ended": False,
                               "disabled": True}, _state(two)  # fmt: skip
        assert _state(four)["running"], _state(four)
        root.join(60)
    finally:  # (the pages' and the next tests' server, on the same port)
        r.server = start_server(
            r.dash.home, "--listen", f"127.0.0.1:{port}", log_name="serve-after-page-kill.log",
            env={"GPULEDGER_WHATIF_TIMEOUT": str(SLOW_S)},
        )  # fmt: skip
    _show(four, True)
    for page in (two, four):  # before: four said "has ended: its result … shows in that tab"
        page.wait_for_selector("#whatif-lost", timeout=15_000)
        line = page.locator("#whatif-lost").inner_text()
        assert first in line and "restarted" in line and "\n" not in line, line
        assert _state(page) == {"running": False, "silent": False, "lost": True, "ended": False,
                                "disabled": False}, _state(page)  # fmt: skip
    # the server gone, the pages' reads failed (logged by the browser), nothing else
    unexpected = [
        e
        for e in errors_one + errors_two + errors_three + errors_four
        if not e.startswith("Failed to load resource")
    ]
    assert unexpected == [], unexpected


def test_another_browser_offline_for_seconds_says_the_server_is_not_answering_not_lost(
    reviewed: Reviewed, browser: Browser
) -> None:
    """atk55-29 F2: one failed look at her turn (a network blip, a proxy's 502, a 429) made a
    tab of another browser say her what-if was lost, Run enabled, while it ran on (and back to
    "running" at its next look). Now it says "the server is not answering (N s)", its Run
    waiting, until an answer (DevTools offline for 5 s at least, as on a Wi-Fi drop)."""
    r = reviewed
    kids = children(r)
    first, second = sorted(kids)[:2]
    root, held = _held_ahead(r, first)
    try:
        two, errors_two = _budget(browser, r, second)  # another browser of hers
        one, errors_one = _budget(browser, r, first)
        _ask(one, kids[first]["raw_shares"] + 7)
        two.wait_for_selector("#whatif-running", timeout=10_000)
        seen: list[dict[str, Any]] = []
        two.context.set_offline(True)
        began = time.monotonic()
        try:  # 5 s at least, until its look has failed (a loaded machine delays its timers)
            while time.monotonic() - began < 5 or not any(s["silent"] for s in seen):
                assert time.monotonic() - began < 30, seen[-3:]
                seen.append(_state(two))
                two.wait_for_timeout(250)
        finally:
            two.context.set_offline(False)
        two.wait_for_function("!document.querySelector('#whatif-silent')", timeout=20_000)
        seen.append(_state(two))
    finally:
        _go_on(held)
    assert not [s for s in seen if s["lost"] or not s["disabled"] or not s["running"]], seen
    two.wait_for_selector("#whatif-elsewhere", timeout=SLOW_S * 1000)  # hers ended: said how
    one.wait_for_selector("#whatif-result", timeout=SLOW_S * 1000)
    assert "its result shows in that tab" in two.locator("#whatif-elsewhere").inner_text()
    root.join(SLOW_S)
    unexpected = [e for e in errors_one + errors_two if not e.startswith("Failed to load resource")]
    assert unexpected == [], unexpected


def test_a_hung_server_is_said_not_to_answer_in_every_tab_which_go_on_once_it_does(
    reviewed: Reviewed, browser: Browser
) -> None:
    """atk55-29 F4: a server that hangs without closing its sockets (SIGSTOP 40 s: a suspended
    VM, a network black hole) left every tab saying "running", its time stopped, its Run
    disabled: the looks at her turn and the asking tab's stream waited with no timeout. Now a
    look unanswered in 8 s, or a stream quiet for 8 s (it sends a line every 2 s), says "the
    server is not answering (N s)" in every tab; once the server answers again they go on."""
    r = reviewed
    kids = children(r)
    first, second = sorted(kids)[:2]
    root, held = _held_ahead(r, first)
    try:
        one, errors_one = _budget(browser, r, first)
        three, errors_three = watched(one.context)
        _opened(three, r, second)
        two, errors_two = _budget(browser, r, second)
        _ask(one, kids[first]["raw_shares"] + 8)
        for page in (two, three):
            page.wait_for_selector("#whatif-running", timeout=10_000)
        os.kill(r.server.proc.pid, signal.SIGSTOP)
        try:
            for page in (one, two, three):  # before: "running" for as long as it hung
                page.wait_for_selector("#whatif-silent", timeout=30_000)
                assert "not answering" in page.locator("#whatif-silent").inner_text()
                assert _state(page) == {"running": True, "silent": True, "lost": False,
                                        "ended": False, "disabled": True}, _state(page)  # fmt: skip
        finally:
            os.kill(r.server.proc.pid, signal.SIGCONT)
        for page in (one, two, three):
            page.wait_for_function("!document.querySelector('#whatif-silent')", timeout=20_000)
            assert _state(page)["running"] and not _state(page)["lost"], _state(page)
    finally:
        _go_on(held)
    one.wait_for_selector("#whatif-result", timeout=SLOW_S * 1000)
    for page in (two, three):
        page.wait_for_selector("#whatif-elsewhere", timeout=SLOW_S * 1000)
    root.join(SLOW_S)
    unexpected = [e for e in errors_one + errors_two + errors_three
                  if not e.startswith("Failed to load resource")]  # fmt: skip
    assert unexpected == [], unexpected
