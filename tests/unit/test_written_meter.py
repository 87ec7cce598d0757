"""Each person's bytes written to the log are metered (atk44-25 F9: looped 4 MB submits and
cancels grew the log ~15 MiB/s for good and slowed another's submits ~190x), reserved before a
write (atk44z F2), and a cancel is never refused by it (atk44z F5)."""

from __future__ import annotations

import msgspec

from ledger.server.commands import frees, reserve
from ledger.server.meters import WRITE_BYTES_BURST, WRITE_BYTES_PER_S, Written
from schemas import api
from schemas import commands as c
from schemas.bounds import MAX_REQUEST_WRITTEN


def test_a_person_past_her_bytes_waits_until_they_fill_and_others_do_not() -> None:
    meter = Written()
    assert meter.retry_in("alice", 0.0) == 0
    meter.charge("alice", WRITE_BYTES_BURST, 0.0)  # the whole allowance: the next write waits
    assert meter.retry_in("alice", 0.0) == 0
    meter.charge("alice", 900 * 1024, 0.0)  # past it: refused until it fills back
    assert meter.retry_in("alice", 0.0) == 900 * 1024 / WRITE_BYTES_PER_S
    assert meter.retry_in("alice", 5.0) == (900 * 1024 - 5 * WRITE_BYTES_PER_S) / WRITE_BYTES_PER_S
    assert meter.retry_in("alice", 8.0) == 0
    assert meter.retry_in("bob", 0.0) == 0  # each person her own


def test_a_sustained_flood_is_held_to_the_rate() -> None:
    meter, now, written = Written(), 0.0, 0
    while now < 600:  # ten minutes of 4 MB writes, each as soon as allowed
        now += meter.retry_in("alice", now)
        meter.charge("alice", 4 << 20, now)
        written += 4 << 20
    assert written <= WRITE_BYTES_BURST + now * WRITE_BYTES_PER_S + (4 << 20)  # was unbounded


def test_writes_under_way_at_once_pass_the_burst_by_one_request_at_most() -> None:
    """atk44z F2: checked before and charged after, 16 writes admitted at once all wrote."""
    meter, size = Written(), 15 << 20
    admitted = [meter.reserve("bob", size, 0.0) == 0 for _ in range(16)]  # none settled yet
    assert sum(admitted) * size <= WRITE_BYTES_BURST + size  # was 16 x 15 MiB
    assert admitted == [True, True, True] + [False] * 13
    assert meter.retry_in("bob", 0.0) > 0
    for _ in range(3):  # each wrote a third of what it reserved: the rest given back
        meter.settle("bob", size, size // 3, 0.0)
    assert meter.retry_in("bob", 0.0) == 0
    assert meter.reserve("bob", 1, 0.0) == 0


def test_a_writes_reservation_bounds_what_it_writes() -> None:
    """What a command or a batch may write, known before it is decided: at least what it
    writes (its answer), an array per task, never above the most a request may write."""
    wide = ("/bin/true", "x" * 50_000)
    one = c.SubmitJob(actor="bob", account="a/b", gpus=1, command=wide)
    array = c.SubmitJob(actor="bob", account="a/b", gpus=1, command=wide, array=tuple(range(20)))
    body = msgspec.json.encode(one)
    assert len(body) + 450 < reserve(one, body) <= len(body) + 2048
    assert (
        20 * (len(body) + 450)
        < reserve(array, msgspec.json.encode(array))
        <= 20 * (len(body) + 2048)
    )
    many = c.SubmitJob(actor="bob", account="a/b", gpus=1, command=wide, array=tuple(range(9999)))
    assert reserve(many, msgspec.json.encode(many)) == MAX_REQUEST_WRITTEN + 1024
    batch = api.Batch(commands=[one, array])
    assert reserve(batch, msgspec.json.encode(batch)) == reserve(
        one, msgspec.json.encode(one)
    ) + reserve(array, msgspec.json.encode(array))


def test_only_writes_that_end_what_metered_writes_made_go_past_the_meter() -> None:
    """atk44z F5: a person past the meter could not cancel her own array."""
    cancel = c.CancelJob(actor="bob", job_id=3, whole_array=True)
    hold = c.HoldJob(actor="bob", job_id=3)
    assert frees(cancel) and frees(hold) and frees(c.RevokeToken(actor="bob", token_id="t"))
    assert frees(api.Batch(commands=[cancel, hold]))
    assert not frees(c.ReleaseJob(actor="bob", job_id=3))  # a hold again after it: metered
    assert not frees(c.SubmitJob(actor="bob", account="a/b", gpus=1))
    assert not frees(api.Batch(commands=[cancel, c.SubmitJob(actor="b", account="a/b", gpus=1)]))
    assert not frees(api.Batch(commands=[]))


def test_a_users_job_tokens_write_against_her_own_allowance() -> None:
    """atk45-25 F4: each job token had a meter of its own (`whose` is the job), so a user with
    7 running jobs wrote 267 MiB in 30 s past her 32 MiB; her jobs' tokens and she share one."""
    from ledger.server.identity import Identity

    alice = Identity(actor="alice", via="peer:1000")
    jobs = [Identity(actor=f"@job:{n}", via=f"token:t{n}", jobs_of="alice") for n in range(7)]
    assert {who.writes_as for who in (alice, *jobs)} == {"alice"}
    meter = Written()
    for who in jobs:  # each job's token writes the whole allowance once
        meter.reserve(who.writes_as, WRITE_BYTES_BURST, 0.0)
    assert meter.retry_in(alice.writes_as, 0.0) > 0  # past it: she waits too
    assert Identity(actor="bob", via="token:b").writes_as == "bob"  # anyone else: `whose`
