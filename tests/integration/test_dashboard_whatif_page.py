"""The Budget review page while a what-if runs (Debian's chromium driven by Playwright, a real
`gpuledger serve`): a manager looking at another child meanwhile sees whose what-if runs, and
the result stays with the child it was asked for."""

from __future__ import annotations

import threading
from typing import Any

from playwright.sync_api import Browser

from tests.integration.test_dashboard import browser, signed_in, watched
from tests.integration.test_dashboard_whatif import (
    SLOW_S,
    Reviewed,
    _until_child,
    ask,
    children,
    reviewed,
)

__all__ = ["browser", "reviewed"]  # the module fixtures, shared


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
