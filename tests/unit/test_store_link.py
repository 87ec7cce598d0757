"""A server whose own link to PostgreSQL drops packets (atk45ha F3): health says every failed
lease statement for a lease after it (it cleared at the next answer, so it was almost never
seen), `status` does not take its own old view of the lease for a leader that stopped
renewing, a standby's reads say how old its log is past one lease, and the CLI keeps the
position of its last write on disk, so a read in the next command, through another server, is
never older than that write (docs/ha.md, "A server's own link to the store")."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ledger.cli.serve import _lease_line
from ledger.server.ha import Leadership
from ledger.server.ha_front import HAFront
from ledger.server.store_seen import stale_s, store_trouble
from ledger.wire.client import Client
from ledger.wire.written import last_written, remember, written_file
from schemas import commands as c
from schemas.api import Health
from tests.unit.test_follow_leader import Fake, fakes  # noqa: F401 (the fixture)


@pytest.mark.parametrize(
    ("case", "unreachable", "erred", "asking", "want"),
    [
        ("the link answers", None, None, None, None),
        ("the store away (the last statement failed)", "timeout", (99.0, "timeout"), None,
         "timeout"),
        ("a statement failed 2 s ago, the next answered", None, (98.0, "timeout expired"), None,
         "a lease statement failed 2.0 s ago: timeout expired"),
        ("failed a lease ago: said no more", None, (95.0, "timeout"), None, None),
        ("a statement unanswered for 2 s (a third of 5 s: 1.7)", None, None, 98.0,
         "a lease statement has had no answer for 2.0 s"),
        ("one unanswered for 1 s: a renewal's time", None, None, 99.0, None),
    ],
)  # fmt: skip
def test_what_health_says_of_the_lease_statements(
    case: str,
    unreachable: str | None,
    erred: tuple[float, str] | None,
    asking: float | None,
    want: str | None,
) -> None:
    assert store_trouble(100.0, unreachable, erred, asking, 5.0) == want, case


def test_a_standby_s_reads_are_stale_past_one_lease_and_a_leader_s_never() -> None:
    assert stale_s(100.0, 96.0, False, 5.0) is None
    assert stale_s(100.0, 90.0, False, 5.0) == 10.0
    assert stale_s(100.0, 90.0, True, 5.0) is None  # the only writer while its lease runs
    assert stale_s(100.0, 0.0, False, 5.0) is None  # not read yet: at its start


class FlakyLease:
    """A lease whose statements fail on the turns listed (a link that drops packets)."""

    epoch, lease_s, address, node = 0, 5.0, "http://me:1", None
    answer_s, deadline, renewing, answered_at = 5.0 / 3, 0.0, None, 0.0  # a standby's (`away`)

    def __init__(self, failing: set[int]) -> None:
        self.failing, self.turn = failing, 0

    def may_act(self) -> bool:
        return False

    def acquire(self) -> bool:
        self.turn += 1
        if self.turn in self.failing:
            raise OSError("consuming input failed: server closed the connection unexpectedly")
        return False

    def leader(self) -> Any:
        return None

    def refusal(self, leader: Any) -> None:
        return None


def test_a_failed_lease_statement_is_said_for_a_lease_though_the_next_answers() -> None:
    """Before, `store_error` (then `unreachable`) was cleared by the next statement that
    answered: health said nothing of a link that failed one statement in two."""
    ha = Leadership(FlakyLease({2}))  # type: ignore[arg-type]
    ha._tick()
    assert ha.store_error() is None
    ha._tick()  # fails
    ha._tick()  # answers
    assert ha.unreachable is None  # the store answers now ...
    said = ha.store_error() or ""  # ... and the failure is said for a lease
    assert said.startswith("a lease statement failed 0.0 s ago: consuming input failed"), said
    assert ha.lease_read_s_ago() is not None


class TakenLease(FlakyLease):
    """A flaky lease whose take succeeds on the turn after a failure."""

    def acquire(self) -> bool:
        super().acquire()
        self.epoch = 1
        return True


def test_a_server_that_takes_the_lease_says_no_failure_from_before_it() -> None:
    """atk61-ha F5: a new leader's health said "a lease statement failed 1.5 s ago" for ~4 s
    after it led: its take committed, so the link answers."""
    ha = Leadership(TakenLease({1}))  # type: ignore[arg-type]
    ha._tick()  # fails
    assert (ha.store_error() or "").startswith("consuming input failed")
    ha._tick()  # takes the lease
    assert ha.unreachable is None
    assert ha.store_error() is None, ha.store_error()


def health(**kw: Any) -> Health:
    return Health(status="up", version="0", started_at=0.0, head=0, cycles=0, last_cycle_at=None,
                  last_cycle_s=None, projection_position=0, projection_lag=0, relay_position=None,
                  relay_lag=None, role="standby", leader="http://a:1", epoch=3, lease_s=5.0,
                  **kw)  # fmt: skip


def test_status_does_not_take_its_own_old_view_of_the_lease_for_the_leader_s_fault() -> None:
    """A standby whose lease statements hung for 6 s read the row 6 s ago: it used to say
    "expired 0.4 s ago: the leader does not renew it (down, paused or cut off)"."""
    hung = "a lease statement has had no answer for 6.0 s"
    line = _lease_line(health(lease_expires_in_s=-0.4, lease_renewed_s_ago=5.4,
                              lease_read_s_ago=6.0, store_error=hung))  # fmt: skip
    assert "the leader does not renew it" not in line, line
    assert line == (
        "5 s, renewed 5.4 s ago as this server last read it, 6.0 s ago: its own link to the "
        "store fails (the `store` line); the leader's renewals are not seen from here"
    )
    # read just now, a statement failed lately: the row is as fresh as ever
    fresh = _lease_line(health(lease_expires_in_s=3.8, lease_renewed_s_ago=1.2,
                               lease_read_s_ago=0.2,
                               store_error="a lease statement failed 1.0 s ago: x"))  # fmt: skip
    assert fresh == "5 s, renewed 1.2 s ago, expires in 3.8 s"
    # the store away: as before (atk33-28 F6, F10)
    away = _lease_line(health(lease_expires_in_s=-3.0, lease_renewed_s_ago=8.0,
                              lease_read_s_ago=8.0, store_error="connection refused"))  # fmt: skip
    assert away == "5 s, renewed 8.0 s ago: nobody leads until the store answers and commits"


def _front(read_at: float, acting: bool = False) -> tuple[HAFront, list[Any]]:
    ha = SimpleNamespace(acting=lambda: acting, leader_address=lambda: "http://other:1",
                         lease=SimpleNamespace(address="http://me:1", may_act=lambda: acting,
                                               lease_s=5.0, node=None),
                         role="leader" if acting else "standby", unreachable=None,
                         away=lambda: None, notify=lambda: None)  # fmt: skip

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    sent: list[Any] = []
    return HAFront(app, ha, lambda: 7, read_at=lambda: read_at), sent  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "read_s_ago", "acting", "want"),
    [
        ("a standby that read the log just now", 0.3, False, None),
        ("a standby that has not read it for 12 s", 12.0, False, "12."),
        ("a leader", 12.0, True, None),
    ],
)
def test_a_standby_s_read_says_how_old_its_log_is_past_one_lease(
    case: str, read_s_ago: float, acting: bool, want: str | None
) -> None:
    """Before, it answered from what it last folded and said nothing (atk45ha F3)."""
    front, sent = _front(time.monotonic() - read_s_ago, acting)

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "GET", "path": "/v1/jobs", "headers": [],
             "query_string": b""}  # fmt: skip
    asyncio.run(front(scope, receive, send))
    stale = dict(sent[0]["headers"]).get(b"x-gpuledger-stale")
    if want is None:
        assert stale is None, case
    else:
        assert stale is not None and stale.decode().startswith(want), case


def test_the_cli_says_a_stale_answer_in_one_line(
    fakes: tuple[Fake, Fake],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    stand, _ = fakes
    stand.answer = lambda *_: (200, {"X-Gpuledger-Stale": "12.5"}, b"[]")
    client = Client(stand.url, "tok")
    client.get("jobs")
    client.get("jobs")
    err = capsys.readouterr().err
    assert err == (
        f"note: {stand.url} answered from the log as it read it 12 s ago (it cannot read its "
        "store now): newer changes may be missing; `gpuledger status` there says why\n"
    )
    client.close()


def test_a_read_in_the_next_command_asks_for_the_last_write_of_this_user(
    fakes: tuple[Fake, Fake],  # noqa: F811
) -> None:
    """`gpuledger submit` through the leader, then `gpuledger jobs` (another process: another
    client) answered by a standby: it asked for no position, and a standby behind the write
    answered without it. Now the position is kept on disk per list of servers."""
    lead, stand = fakes
    urls = f"{lead.url},{stand.url}"
    result = json.dumps({"position": 42, "events": []}).encode()
    lead.answer = lambda *_: (200, {"X-Gpuledger-Position": "42"}, result)
    submit = Client(urls, "tok")
    submit.execute(c.SubmitJob(actor="", account="a/b", gpus=1, min_runtime_s=60))
    submit.close()
    assert last_written(written_file([stand.url, lead.url])) == 42  # the list in any order
    stand.answer = lambda *_: (200, {"X-Gpuledger-Position": "42"}, b"[]")
    jobs = Client(f"{stand.url},{lead.url}", "tok")  # the next command, the standby first
    jobs.get("jobs")
    assert stand.seen[-1][2]["x-gpuledger-min-position"] == "42"
    jobs.close()


def test_the_kept_position_only_rises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = written_file(["http://a:1", "http://b:1"])
    assert path.parent == tmp_path / "gpuledger"
    remember(path, 10)
    remember(path, 7)  # another command wrote earlier and answered later
    assert last_written(path) == 10
    path.write_text("junk")
    assert last_written(path) == 0
    assert last_written(None) == 0


def test_a_kept_position_of_thousands_of_digits_is_no_position(tmp_path: Path) -> None:
    """atk46-ha F2: a position file of more than 4,300 digits made every CLI command of its user
    `internal error: ValueError` (Python refuses to read such an int): it reads as none now,
    and the next write replaces it."""
    kept = tmp_path / "written"
    kept.write_text("9" * 5000 + "\n")
    assert last_written(kept) == 0
    remember(kept, 42)
    assert last_written(kept) == 42
    kept.write_text("12345678901234567890\n")  # 20 digits: past any 64-bit position
    assert last_written(kept) == 0
