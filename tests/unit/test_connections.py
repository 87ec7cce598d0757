"""The connections' limits, pure parts (docs/security.md, row T23): who holds which
connections (`Tally`), when a send has stalled (`Progress`), the settings (`limits_from_env`),
and a request's read admission held until its answer is sent (`ReadPool.admitted`)."""

from __future__ import annotations

import pytest

from ledger.server import connections as cn
from ledger.server import meters
from ledger.server.readpool import ReadPool
from schemas.errors import InvalidCommand, TooBusy


def test_the_server_cap_counts_every_connection_and_frees_a_closed_one() -> None:
    t = cn.Tally(cn.Limits(max_connections=2))
    assert t.opened(1) is None and t.opened(2) is None
    assert t.opened(3) == "server_full"  # answered 503, not counted
    t.closed(1)
    assert t.opened(3) is None and t.open == {2, 3}


def test_the_unix_sockets_reserve_is_never_taken_over_tcp() -> None:
    """atk36-25: an outsider refilling the cap over TCP kept the host's admin out too."""
    t = cn.Tally(cn.Limits(max_connections=4, local_reserve=2, per_address=100))
    for conn in range(4):
        assert t.opened(conn, f"10.0.0.{conn}") is None
    assert t.opened(10, "10.0.0.9") == "server_full"  # TCP: full at 4
    assert t.opened(11, "root", local=True) is None  # the socket: 2 more
    assert t.opened(12, "alice", local=True) is None
    assert t.opened(13, "bob", local=True) == "server_full"
    t.closed(11)
    assert t.opened(14, "10.0.0.9") == "server_full"  # a freed reserve slot is the socket's
    assert t.opened(15, "bob", local=True) is None


def test_every_connection_counts_against_one_total_tcp_too() -> None:
    """atk37-25 F4: the socket filled first, then TCP admitted its whole cap beside it: more
    connections than the open files `serve` had sized for."""
    lim = cn.Limits(max_connections=2, local_reserve=1, admin_reserve=1, per_person=100)
    t = cn.Tally(lim)
    assert all(t.opened(n, f"u{n}", local=True) is None for n in range(3))  # TCP's room too
    assert t.opened(3, "u9", local=True) == "server_full"
    assert t.opened(4, "10.0.0.1") == "server_full"  # TCP counts the socket's
    assert t.opened(5, "root", local=True, admin=True) is None  # the admins' reserve
    assert t.opened(6, "root", local=True, admin=True) == "server_full"
    assert len(t.open) == lim.most == 4
    t.closed(0)  # the admin's counts in the total too: still full for TCP
    assert t.opened(7, "10.0.0.1") == "server_full"
    t.closed(1)
    assert t.opened(8, "10.0.0.1") is None and t.opened(9, "10.0.0.1") == "server_full"


@pytest.mark.parametrize(
    ("case", "fill"),
    [
        ("TCP first", ["tcp"] * 4 + ["local"] * 2),
        ("the socket first", ["local"] * 6 + ["tcp"] * 4),
        ("taking turns", ["local", "tcp"] * 5),
    ],
)
def test_the_admins_reserve_is_left_whoever_fills_the_rest(case: str, fill: list[str]) -> None:
    """atk37-25 F2: local accounts together filled the socket's reserve and root heard 503."""
    lim = cn.Limits(max_connections=4, local_reserve=2, admin_reserve=2, per_person=1,
                    per_address=100)  # fmt: skip
    t = cn.Tally(lim)
    for n, where in enumerate(fill):
        t.opened(n, f"u{n}", local=True) if where == "local" else t.opened(n, "10.0.0.1")
    assert len(t.open) == 6, case
    assert t.opened(100, "u100", local=True) == "server_full", case
    assert t.opened(101, "root", local=True, admin=True) is None, case
    assert t.opened(102, "alice", local=True, admin=True) is None, case
    assert t.opened(103, "mgr", local=True, admin=True) == "server_full", case
    assert len(t.open) == lim.most, case


def test_a_tcp_address_holds_its_cap_of_connections_no_one_has_claimed() -> None:
    t = cn.Tally(cn.Limits(per_person=2, per_address=3))
    me = "10.0.0.1"
    for conn in range(3):
        assert t.opened(conn, me) is None
    assert t.opened(50, me) == "waiting"  # its first request decides (below)
    assert not t.first_request(50, None)  # no token: refused 429
    t.closed(50)
    assert t.opened(51, "10.0.0.2") is None  # another source is served
    # a request with a token claims a connection: it is its person's, no longer the source's
    assert t.claim(0, "carol")
    assert t.sources[me] == {1, 2} and t.opened(52, me) is None
    t.closed(52)
    t.closed(1)
    assert t.opened(53, me) is None and 1 not in t.source


def test_a_socket_connection_is_its_accounts_from_the_start_claimed_or_not() -> None:
    """atk37-25 F2: an OS account held 16 connections unclaimed and 16 claimed by its name."""
    t = cn.Tally(cn.Limits(per_person=2))
    assert t.opened(1, "alice", local=True) is None and t.opened(2, "alice", local=True) is None
    assert t.opened(3, "alice", local=True) == "per_person"
    assert t.claim(1, "alice")  # her own request: already hers
    assert not t.claim(4, "alice") and t.opened(4, "10.0.0.1") is None
    assert not t.claim(4, "alice")  # over TCP too: one cap for the account
    assert t.opened(5, cn.local_source(4242), local=True) is None  # a uid with no name: its own
    assert t.claim(2, "bob")  # a token of another account sent on the socket: theirs
    assert t.people == {"alice": {1}, "bob": {2}, "uid 4242": {5}}
    assert t.opened(6, "alice", local=True) is None


@pytest.mark.parametrize(
    ("peer", "want"),
    [
        (("127.0.0.1", 5000), "127.0.0.1"),
        (("::ffff:10.1.2.3", 5000, 0, 0), "10.1.2.3"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::9", 6000, 0, 0), "2001:db8:1:2::/64"),  # one site's /64: one source
        (None, ""),
    ],
)
def test_a_tcp_source_is_its_address_and_an_ipv6_one_its_64(peer: object, want: str) -> None:
    assert cn.source_of(peer) == want


def test_requests_of_no_one_take_from_their_sources_bucket() -> None:
    """atk36-25 F6: an outsider looping /v1/health or 401s had no admission at all."""
    r = meters.Rates(per_s=4.0, burst=8.0, max_wait_s=1.0)
    assert all(r.take("10.0.0.1", 100.0) == 0 for _ in range(8))  # a burst of 8
    # then each waits its turn, a quarter second apart, up to a second ahead
    assert [r.take("10.0.0.1", 100.0) for _ in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert r.take("10.0.0.1", 100.0) is None  # past a second's wait: refused, nothing taken
    assert r.retry_in("10.0.0.1", 100.0) == 1.25
    assert r.take("10.0.0.2", 100.0) == 0  # another source's bucket is its own
    assert r.take("10.0.0.1", 100.25) == 1.0  # a turn came back
    assert r.take("10.0.0.1", 110.0) == 0  # refilled, at most the burst
    assert sum(r.take("10.0.0.1", 110.0) == 0 for _ in range(30)) == 7


@pytest.mark.parametrize(
    ("case", "gap_s", "want_refused"),
    [
        ("one at a time, as fast as it can: slowed, never refused", 0.0, False),
        ("one at a time at the rate: never waits past the burst", 0.25, False),
    ],
)
def test_a_client_asking_one_at_a_time_is_slowed_never_refused(
    case: str, gap_s: float, want_refused: bool
) -> None:
    r = meters.Rates(per_s=4.0, burst=8.0, max_wait_s=1.0)
    now, refused = 0.0, False
    for _ in range(200):
        wait = r.take("10.0.0.1", now)
        refused |= wait is None
        now += (wait or 0.0) + gap_s  # the next asked once this one is answered
    assert refused is want_refused, case


def test_a_rates_forgets_the_sources_whose_bucket_is_full_again() -> None:
    r = meters.Rates(per_s=1.0, burst=2.0)
    for i in range(meters.PRUNE_AT):
        r.take(f"10.0.{i // 256}.{i % 256}", 0.0)
    r.take("late", 10.0)  # the others are full again by now: forgotten
    assert set(r.level) == {"late"}


def test_a_persons_cap_refuses_their_next_connection_and_serves_another_person() -> None:
    t = cn.Tally(cn.Limits(per_person=2))
    for conn in (1, 2, 3, 4):
        t.opened(conn)
    assert t.claim(1, "alice") and t.claim(2, "alice")
    assert t.claim(1, "alice")  # a connection's next request: already hers
    assert not t.claim(3, "alice")  # the third: refused
    assert t.owner.get(3) is None
    assert t.claim(3, "carol")  # another person is served
    t.closed(2)
    assert t.claim(4, "alice") and t.people == {"alice": {1, 4}, "carol": {3}}


def test_a_connection_passed_to_another_caller_counts_for_them_alone() -> None:
    t = cn.Tally(cn.Limits(per_person=1))
    t.opened(1)
    assert t.claim(1, "alice") and t.claim(1, "bob")
    assert t.people == {"bob": {1}}
    t.closed(1)
    assert t.people == {} and t.owner == {}


@pytest.mark.parametrize(
    ("case", "steps", "want_stalled"),
    [
        ("nothing buffered is never stalled", [(100, 0, 0.0), (100, 0, 60.0)], False),
        ("bytes leaving keep it alive", [(100, 90, 0.0), (100, 50, 6.0), (100, 10, 12.0)], False),
        ("no byte leaves for the limit", [(100, 90, 0.0), (100, 90, 5.0), (100, 90, 10.0)], True),
        ("not yet at the limit", [(100, 90, 0.0), (100, 90, 9.9)], False),
        # more written while the client reads nothing: still nothing left
        ("writes that pile up are no progress", [(100, 90, 0.0), (200, 190, 10.0)], True),
        (
            "drained, then waiting anew",
            [(100, 90, 0.0), (100, 0, 9.0), (200, 100, 10.0), (200, 100, 19.0)],
            False,
        ),
        (
            "drained, then stalled anew",
            [(100, 90, 0.0), (100, 0, 9.0), (200, 100, 10.0), (200, 100, 20.0)],
            True,
        ),
    ],
)
def test_a_send_is_stalled_when_no_byte_leaves_for_the_limit(
    case: str, steps: list[tuple[int, int, float]], want_stalled: bool
) -> None:
    p = cn.Progress(stall_s=10.0)
    got = [p.observe(written, buffered, now) for written, buffered, now in steps]
    assert got[-1] is want_stalled, case
    assert not any(got[:-1]), case


def test_the_settings_come_from_the_environment_and_bad_ones_are_one_line() -> None:
    assert cn.limits_from_env({}) == cn.Limits(1024, 16, 10.0, 64, 16, 64, 20.0)
    got = cn.limits_from_env({cn.MAX_CONNECTIONS_ENV: "50", cn.PER_PERSON_ENV: "3",
                              cn.SEND_STALL_ENV: "2.5", cn.LOCAL_ENV: "8",
                              cn.PER_ADDRESS_ENV: "5", cn.ANONYMOUS_RATE_ENV: "2.5",
                              cn.ADMIN_ENV: "4"})  # fmt: skip
    assert got == cn.Limits(50, 3, 2.5, 8, 4, 5, 2.5) and got.check_s == 0.625
    assert got.most == 62
    assert got.anonymous_burst == 5.0
    for name, bad in ((cn.SEND_STALL_ENV, "0"), (cn.PER_PERSON_ENV, "x"),
                      (cn.MAX_CONNECTIONS_ENV, "-1"), (cn.LOCAL_ENV, "0"),
                      (cn.PER_ADDRESS_ENV, "-3"), (cn.ANONYMOUS_RATE_ENV, "x"),
                      (cn.ADMIN_ENV, "0")):  # fmt: skip
        with pytest.raises(InvalidCommand, match=name):
            cn.limits_from_env({name: bad})


def _pool() -> ReadPool:
    async def on_worker(fn: object) -> object:
        raise AssertionError("not used")

    return ReadPool(lambda: None, on_worker, per_caller=2)  # type: ignore[arg-type,return-value]


def test_a_read_counts_against_its_person_until_its_answer_is_sent() -> None:
    pool = _pool()
    with cn._holding() as holds:
        with pool.admitted("alice", read=True):
            pass
        assert pool._running == {"alice": 1}  # computed, not sent: still hers
    with (
        pool.admitted("alice", read=True),  # her second at once
        pytest.raises(TooBusy),
        pool.admitted("alice", read=True),  # a third
    ):
        pass
    for release in holds.releases:  # sent
        release()
    assert pool._running == {}


def test_a_request_is_one_read_however_many_parts_of_it_are_admitted() -> None:
    pool = _pool()
    with cn._holding() as holds:
        for _ in range(3):  # a kept answer looked up, then computed, ...
            with pool.admitted("alice", read=True):
                pass
        assert pool._running == {"alice": 1}
        assert len(pool._recent["alice\0"]) == 1  # one of her minute's reads
    for release in holds.releases:
        release()
    assert pool._running == {}


def test_outside_a_served_request_a_read_is_released_when_it_ends() -> None:
    pool = _pool()
    with pool.admitted("alice", read=True):
        assert pool._running == {"alice": 1}
    assert pool._running == {}


def test_the_last_reads_are_kept_for_people_with_none_under_way() -> None:
    """atk36-25 F3: eight people who each left two answers unread held everyone's 16 reads;
    another person's were refused. Now a person with one under way is refused once
    `max_waiting - fresh_reserve` are under way; the rest are for people with none."""
    pool = ReadPool(lambda: None, _no_worker, per_caller=2, max_waiting=16, fresh_reserve=4)  # type: ignore[arg-type,return-value]
    colluders = [f"u{i}" for i in range(8)]
    held = []
    for who in colluders * 2:  # each asks twice, reads nothing
        try:
            pool._admit(who, 0.0, 1200)
        except TooBusy as err:
            held.append((who, err))
            continue
        pool._running[who] = pool._running.get(who, 0) + 1
    assert sum(pool._running.values()) == 12  # eight first reads and four second ones
    assert len(held) == 4 and all("for people with none" in str(e) for _w, e in held)
    for i in range(4):  # four other people are served
        pool._admit(f"carol{i}", 0.0, 1200)
        pool._running[f"carol{i}"] = 1
    with pytest.raises(TooBusy, match="16 queries under way"):
        pool._admit("dave", 0.0, 1200)  # the whole bound still holds


async def _no_worker(fn: object) -> object:
    raise AssertionError("not used")


def test_a_job_tokens_connections_are_its_jobs_own_allowance_not_a_persons() -> None:
    """atk38-25 F6: counted as the job's owner's, a manager's 16 job tokens for a member's
    job locked the member out of the API; each token its own account at 16, one user's 64
    running jobs held 1,024 connections (atk37-25 F1). A job's tokens have `per_job`, all the
    jobs of one owner together `per_person`, and the owner's own 16 are untouched."""
    t = cn.Tally(cn.Limits(per_person=6, per_job=4, per_address=100))
    for conn in range(20):
        t.opened(conn, "10.0.0.1")
    pool = "jobs of bob"
    assert [t.claim(conn, "@job:7", pool) for conn in range(5)] == [True] * 4 + [False]
    assert [t.claim(conn, "@job:8", pool) for conn in (5, 6, 7)] == [True, True, False]
    assert t.claim(7, "@job:9", "jobs of carol")  # another owner's jobs are their own
    assert all(t.claim(conn, "bob") for conn in range(8, 14))  # bob's own: all six
    assert not t.claim(14, "bob")
    t.closed(0)
    assert t.claim(15, "@job:8", pool)  # a closed one frees the job's and the pool's room
    assert cn.Limits().cap("@job:7") == 4 and cn.Limits().cap("bob") == 16


def test_a_job_tokens_identity_is_its_job_and_its_owners_jobs_pool() -> None:
    from ledger.core import tokens
    from ledger.core.state import Job, State, Token
    from ledger.server.identity import Identity
    from schemas import events as e

    state = State()
    spec = e.JobSubmitted(event_id="s", at=1.0, actor="mgr", job_id=7, account="ai2/olmo",
                          user="alice", gpus=1, min_runtime_s=60)  # fmt: skip
    state.jobs[7] = Job(spec=spec, status="running")
    mk = {"name": "", "secret_sha256": "0" * 64, "issued_at": 0.0}
    minted = Token(token_id="b", user="mgr", scope="job", scope_job=7, **mk)  # by a manager
    assert tokens.owner(state, minted) == "alice"
    who = Identity(actor=minted.acts_as, via="token:b", jobs_of="alice")
    assert (who.whose, who.pool) == ("@job:7", "jobs of alice")
    assert Identity(actor="bob", via="token:c").pool is None


def test_anonymous_requests_take_from_their_address_prefix_and_everyones_buckets() -> None:
    """atk38-25 F2: 64 addresses each under its own 20 a second made 1,475 requests a second
    without a token. A request takes from all three buckets or none."""
    levels = meters.Levels((meters.Rates(2.0, 4.0), meters.Rates(3.0, 6.0),
                            meters.Rates(5.0, 10.0)))  # fmt: skip

    def keys(addr: str) -> tuple[str, str, str]:
        return (addr, cn.prefix_of(addr), "")

    taken = sum(levels.take(keys("10.0.0.1"), 0.0) is not None for _ in range(20))
    assert taken == 6  # its address's 4 at once and 2 ahead (a second's wait)
    taken = sum(levels.take(keys("10.0.0.2"), 0.0) is not None for _ in range(20))
    assert taken == 3  # the /24's 6 at once and 3 ahead, 6 of them the first address's
    assert levels.refusing(keys("10.0.0.2"), 0.0) == 1  # its prefix refuses
    taken = sum(levels.take(keys(f"10.0.{i}.1"), 0.0) is not None for i in range(1, 20))
    assert taken == 6  # everyone's 10 and 5 ahead, 9 taken already
    assert levels.refusing(keys("10.9.0.1"), 0.0) == 2
    assert levels.retry_in(keys("10.9.0.1"), 0.0) == pytest.approx(1.2)
    assert levels.take(keys("10.9.0.1"), 0.5) is not None  # a turn came back


@pytest.mark.parametrize(
    ("source", "want"),
    [
        ("10.1.2.3", "10.1.2.0/24"),
        ("2001:db8:1:2::/64", "2001:db8:1::/48"),
        ("uid 1005", "uid 1005"),
    ],
)
def test_an_addresss_prefix_is_its_24_or_its_48(source: str, want: str) -> None:
    assert cn.prefix_of(source) == want


@pytest.mark.parametrize(
    ("case", "files", "want"),
    [
        ("enough files: as set", 2000, (1024, 64, 16)),
        ("a hard limit of 1,024: TCP shrinks", 1024, (688, 64, 16)),
        ("very few: the socket's reserve shrinks too", 400, (110, 18, 16)),
    ],
)
def test_the_caps_fit_the_open_files_and_keep_the_admins_reserve(
    case: str, files: int, want: tuple[int, int, int]
) -> None:
    """atk38-25 F7: caps of 1,104 under a hard limit of 1,024 were only warned about; the
    descriptors ran out first and root's `status` on the socket was reset."""
    got = cn.fit_files(cn.Limits(), files, 256)
    assert (got.max_connections, got.local_reserve, got.admin_reserve) == want, case
    assert got.most + 256 <= files
    with pytest.raises(InvalidCommand, match="open files limited to 270"):
        cn.fit_files(cn.Limits(), 270, 256)


def test_a_persons_refusals_are_held_16_at_once_out_of_their_addresss_count() -> None:
    """atk37-25 F5: a person's 429s were answered at once (~2,600 a second on the event loop);
    held, each stayed counted against its address's 64 and filled it for everyone there."""
    t = cn.Tally(cn.Limits(per_person=2, per_address=3))
    for conn in range(8):
        assert t.opened(conn, "10.0.0.1") is None or conn >= 3
    assert t.claim(0, "alice") and t.claim(1, "alice") and not t.claim(2, "alice")
    assert t.hold_refusal(2, "alice")  # held, and out of 10.0.0.1's count
    assert t.sources == {} and t.opened(10, "10.0.0.1") is None
    assert t.opened(11, "10.0.0.1") is None and t.opened(12, "10.0.0.1") is None
    assert not t.claim(10, "alice") and t.hold_refusal(10, "alice")
    assert not t.claim(11, "alice") and not t.hold_refusal(11, "alice")  # past 2: at once
    assert t.sources == {"10.0.0.1": {11, 12}}
    t.closed(2)
    t.closed(10)
    assert t.refusing == {} and t.refused_for == {}
    assert not t.claim(12, "alice") and t.hold_refusal(12, "alice")


def test_past_its_addresss_cap_a_connection_with_a_token_is_its_accounts() -> None:
    """atk38-25 F4, F5: 64 tokenless connections at a node's (or a standby's) address had its
    agent's (its forwards') connections refused at accept, before their token was read. Now
    one past the address's cap waits for its first request: with a valid token it is that
    account's (not the address's), without one it is refused; it counts in the total
    meanwhile."""
    lim = cn.Limits(max_connections=10, local_reserve=0, admin_reserve=0, per_person=2,
                    per_address=3)  # fmt: skip
    t = cn.Tally(lim)
    node = "10.0.0.1"
    for conn in range(3):  # a stranger's, tokenless
        assert t.opened(conn, node) is None
    assert t.opened(10, node) == "waiting"  # the agent's: counted in the total
    assert 10 in t.open and t.sources[node] == {0, 1, 2}
    t.headers_in(10)
    assert t.first_request(10, "@node:n1") and t.claim(10, "@node:n1")
    assert t.people["@node:n1"] == {10} and 10 not in t.waiting
    assert t.first_request(10, None)  # claimed: a later tokenless request is served on it
    # a stranger's over the cap: its tokenless first request is refused
    assert t.opened(11, node) == "waiting" and not t.first_request(11, None)
    t.closed(11)
    assert 11 not in t.open and not t.waiting and not t.unheard
    # the account's own cap holds: its third is refused by it (429), not admitted
    assert t.opened(12, node) == "waiting" and t.opened(13, node) == "waiting"
    assert t.claim(12, "@node:n1") and not t.claim(13, "@node:n1")
    assert t.people["@node:n1"] == {10, 12} and t.sources[node] == {0, 1, 2}


def test_waiting_connections_count_in_the_total_and_one_address_holds_a_cap_of_them() -> None:
    """The fd sizing stays true (a waiting connection is one of the total), and one address
    never holds more than `per_address` waiting with no headers: past that its oldest silent
    one is refused (an agent's sends its headers at once and is never the oldest)."""
    lim = cn.Limits(max_connections=9, local_reserve=0, admin_reserve=0, per_address=2)
    t = cn.Tally(lim)
    me = "10.0.0.1"
    assert t.opened(0, me) is None and t.opened(1, me) is None
    assert t.opened(2, me) == "waiting" and t.opened(3, me) == "waiting"
    assert t.crowded(me) is None
    assert t.opened(4, me) == "waiting" and t.crowded(me) == 2  # the oldest silent one
    t.headers_in(2)  # refused (or its headers came): never crowded's again
    assert t.crowded(me) is None
    t.headers_in(3)
    assert t.opened(5, me) == "waiting" and t.opened(6, me) == "waiting"
    assert t.crowded(me) == 4
    for conn in (7, 8):
        assert t.opened(conn, f"10.0.1.{conn}") is None
    assert len(t.open) == 9 and t.opened(9, "10.0.2.1") == "server_full"
    for conn in range(9):
        t.closed(conn)
    assert not (t.open or t.waiting or t.unheard or t.sources or t.source)


@pytest.mark.parametrize(
    ("head", "want"),
    [
        (b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", 0),
        (b"POST / HTTP/1.1\r\nHost: t\r\ncontent-length: 12\r\n\r\n", 12),
        (b"POST / HTTP/1.1\r\nContent-Length:  7 \r\n\r\n", 7),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\ntransfer-encoding : identity\r\n\r\n", 400),  # the space
        (b"POST / HTTP/1.1\r\nTRANSFER-ENCODING: chunked\r\n\r\n", 411),
        (b"X\r\n\r\n", 400),  # atk40-25 F2: the parser's own 400, at once, unheld, logged
        (b"GET /\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t\r\n Transfer-Encoding: chunked\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nTransfer_Encoding\r\n\r\n", 400),
        (b"GET /caf\xc3\xa9?q=1 HTTP/1.0\r\n\r\n", 0),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n" + b"a:b\r\n" * 100 + b"\r\n", 0),
        (b"GET / HTTP/1.1\r\n" + b"a:b\r\n" * 101 + b"\r\n", 431),
    ],
)
def test_a_requests_head_gives_its_body_length_or_its_refusal(head: bytes, want: int) -> None:
    """atk39-25 F1, F4: the head is judged on its raw bytes, before the parser's Python calls
    per header line and per body chunk."""
    from ledger.server.protocol import Refusal, body_length

    got = body_length(head)
    assert (got.status if isinstance(got, Refusal) else got) == want
