"""What one request may write to the log is bounded before anything is written: an event no
larger than every reader takes (the relay's Kafka record: atk44-25 F8, a 1.2 MB command line
stopped the relay for good), and a request's events together (atk44-25 F12, an array of 1,000
tasks copying a 105 KB command wrote 186 MiB). Each refusal here was appended on the old code."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.store.application import Ledger
from ledger.store.clock import SimClock, seeded_ids
from schemas import bounds
from schemas import commands as c
from schemas.errors import LedgerError, TooLarge


@pytest.fixture
def lab(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path, SimClock(1_000.0), seeded_ids(1))
    ledger.execute(c.InitLedger(actor="root", admin="root", min_runtime_cap_s=3600))
    ledger.execute_all(
        [
            c.OpenAccount(actor="root", path="lab", kind="program"),
            c.OpenAccount(actor="root", path="lab/a", kind="project", shares=1),
            c.AddMember(actor="root", user="u", project="lab/a"),
            c.AddMember(actor="root", user="v", project="lab/a"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    return ledger


def submit(user: str, command: tuple[str, ...], array: tuple[int, ...] = ()) -> c.SubmitJob:
    return c.SubmitJob(actor=user, account="lab/a", gpus=1, command=command, array=array)


BIG = ("/bin/true", *["x" * 4000] * 300)  # the attack's 1.2 MB command line (F8)


def test_an_event_larger_than_a_reader_takes_is_refused_and_nothing_is_written(
    lab: Ledger,
) -> None:
    before = lab.position
    with pytest.raises(TooLarge, match=r"job.submitted\S* would be 1,2\d\d,\d\d\d bytes stored"):
        lab.execute(submit("u", BIG))
    assert lab.position == before == lab.head()
    fits = ("/bin/true", *["x" * 4000] * 200)  # 800 KB: under the bound, taken
    assert lab.execute(submit("u", fits)).position == before + 1


def test_in_a_group_commit_only_the_oversized_command_is_refused(lab: Ledger) -> None:
    before = lab.position
    done = lab.execute_each([submit("v", ("a",)), submit("u", BIG), submit("v", ("b",))])
    assert isinstance(done[1], TooLarge) and "nothing written" in done[1].line()
    assert not isinstance(done[0], LedgerError) and not isinstance(done[2], LedgerError)
    assert lab.head() == before + 2


def test_an_array_writing_past_the_request_bound_is_refused_whole(lab: Ledger) -> None:
    before = lab.position
    command = ("/bin/true", *["w" * 4000] * 25)  # F12: 100 KB, 1,000 tasks: ~100 MB
    with pytest.raises(TooLarge, match="would write more than 16,777,216 bytes"):
        lab.execute(submit("u", command, array=tuple(range(1000))))
    with pytest.raises(TooLarge, match="would write more than"):  # one batch is one request
        lab.execute_all([submit("u", command, array=tuple(range(100)))] * 2)
    assert lab.head() == before and not lab.state.jobs


def test_the_largest_array_of_an_ordinary_command_fits(lab: Ledger) -> None:
    command = ("python", "train.py", "--config", "configs/big-model.yaml", "--seed", "%a")
    done = lab.execute(submit("u", command, array=tuple(range(100))))
    per_task = sum(len(se) for se in _stored(lab, done.position - 99)) / 100
    assert per_task * bounds.MAX_ARRAY_TASKS < bounds.MAX_REQUEST_WRITTEN / 2


def _stored(lab: Ledger, first: int) -> list[bytes]:
    from ledger.store.relay import open_store, read_raw

    return [r.data for r in read_raw(open_store(lab.home), first - 1, 1000)]


@pytest.mark.parametrize(
    ("size", "total", "want"),
    [
        (bounds.MAX_EVENT_BYTES, 0, None),
        (bounds.MAX_EVENT_BYTES + 1, 0, "more than the 921,600 an event may be"),
        (10, bounds.MAX_REQUEST_WRITTEN - 10, None),
        (11, bounds.MAX_REQUEST_WRITTEN - 10, "would write more than 16,777,216 bytes"),
    ],
)
def test_check_written(size: int, total: int, want: str | None) -> None:
    if want is None:
        bounds.check_written("job.submitted", size, total)
    else:
        with pytest.raises(TooLarge, match=want):
            bounds.check_written("job.submitted", size, total)


def test_a_simulations_or_what_ifs_log_is_not_bounded(tmp_path: Path) -> None:
    """It replays a state (an older log's large events included) and is never relayed."""
    sim = Ledger(tmp_path, SimClock(1_000.0), seeded_ids(1), bounded=False)
    sim.execute(c.InitLedger(actor="root", admin="root"))
    sim.execute_all(
        [
            c.OpenAccount(actor="root", path="lab", kind="program"),
            c.OpenAccount(actor="root", path="lab/a", kind="project", shares=1),
            c.AddMember(actor="root", user="u", project="lab/a"),
            c.RegisterNode(actor="root", node="n1", gpu_type="h100", gpus=8),
        ]
    )
    assert sim.execute(submit("u", BIG)).events


def test_what_a_write_will_write_at_least_is_known_before_it_is_built(lab: Ledger) -> None:
    """atk45-25 F6: a 10,000-task array of a 1.7 KB command built and encoded 16 MiB of events
    before its 413. What it writes at least (`written_floor`: its command line, labels and paths
    once per task) is known once decoded: past the bound, refused before anything is built;
    and never more than what a submission stores."""
    from ledger.server.commands import written_floor
    from schemas import api

    attack = submit("u", ("/bin/true", "y" * 1700), array=tuple(range(10_000)))
    assert written_floor(attack) > bounds.MAX_REQUEST_WRITTEN
    assert written_floor(api.Batch(commands=[submit("u", attack.command, (1, 2))] * 5000)) > (
        bounds.MAX_REQUEST_WRITTEN
    )
    command = ("python", "train.py", "--config", "configs/big-model.yaml", "--seed", "%a")
    ordinary = submit("u", command, array=tuple(range(bounds.MAX_ARRAY_TASKS)))
    assert written_floor(ordinary) < bounds.MAX_REQUEST_WRITTEN / 4
    assert written_floor(c.CancelJob(actor="u", job_id=1)) == 0
    odd = c.SubmitJob(
        actor="u", account="lab/a", gpus=1, command=('say "h\u00e9"\n', "\x01", "x" * 300),
        labels={"k": 'v"\\'}, workdir="/w", stdout="o-%j", stderr="e", job_name="n",
        array=(3, 1, 1, 2),
    )  # fmt: skip
    done = lab.execute(odd)
    stored = sum(map(len, _stored(lab, done.position - 2)))
    assert written_floor(odd) <= stored < 3 * written_floor(odd) + 3 * 2048
