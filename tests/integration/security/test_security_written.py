"""Red team, what a request and a person write to the log (atk44-25): a 1.2 MB submit made an
event the Kafka broker refused and the relay stopped for good (F8); an array of 1,000 tasks of a
105 KB command wrote 186 MiB and answered 100 MB (F12); a user looping max-size submits grew the
log ~15 MiB/s and slowed another's submits ~190x (F9). A real server: each is one line, nothing
appended, and another person's submits are answered. Each refusal here was a 200 before."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.integration.serverkit import make_token, set_up_ledger, start_server


def test_what_a_request_and_a_person_write_is_bounded(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    alice, bob = (make_token(home, "--user", who) for who in ("alice", "bob"))
    server = start_server(home)
    try:

        def submit(token: str, command: list[str], **extra: object) -> tuple[int, Any]:
            body = {"actor": "", "account": "ai2/olmo", "gpus": 1, "command": command, **extra}
            return server.request("POST", "/v1/commands/submit", body, token)

        def job_id(token: str) -> int:
            """A small job's id: one more than the last job's (so none came between)."""
            status, body = submit(token, ["/bin/true"])
            assert status == 200, body
            return int(body["events"][0]["job_id"])

        before = job_id(bob)
        status, body = submit(alice, ["/bin/true", *["x" * 4000] * 300])  # F8: 1.2 MB
        assert status == 413, body
        assert "job.submitted" in body["message"] and "nothing written" in body["message"]
        status, body = submit(alice, ["/bin/true", *["w" * 4000] * 25], array=list(range(1000)))
        assert status == 413, body  # F12: ~100 MB of events
        assert "would write more than 16,777,216 bytes" in body["message"]
        assert job_id(bob) == before + 1  # nothing appended

        big, accepted = ["/bin/true", *["y" * 4000] * 200], 0  # 800 KB: within every bound
        for _ in range(60):  # F9: one person looping max-size submits
            status, body = submit(alice, big)
            if status != 200:
                break
            accepted += 1
        assert status == 429, body
        assert body["message"].startswith("you wrote more than 32 MiB to the log lately")
        # 32 MiB of them less the ~17 MiB her two refusals claimed and were charged (F6)
        assert 14 <= accepted <= 28, accepted
        at = job_id(bob)  # another person's submits go on
        assert submit(alice, ["/bin/true"])[0] == 429
        assert job_id(bob) == at + 1  # nothing of hers appended
    finally:
        assert server.stop() == 0


def test_a_batch_is_charged_what_it_wrote_not_its_body(tmp_path: Path) -> None:
    """atk44z F1: a batch was charged the size of its body: a ~60 KB batch of one array of
    thousands of tasks wrote ~16 MiB each time and a plain user looped them past the meter
    (268 MiB in 45 s, not one 429). Charged its answer (the events it appended): the second
    such batch is refused."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    alice = make_token(home, "--user", "alice")
    server = start_server(home)
    try:
        task = {"actor": "", "account": "ai2/olmo", "gpus": 1, "array": list(range(1_000)),
                "command": ["/bin/true", *["z" * 4_000] * 3], "op": "submit"}  # fmt: skip
        statuses = []
        for _ in range(6):  # each ~1,000 x 12 KB = ~12 MiB written from a ~20 KB body
            status, body = server.request("POST", "/v1/batch", {"commands": [task]}, alice)
            statuses.append(status)
            assert status in (200, 429), body
            if status != 200:
                break
        assert statuses[-1] == 429 and len(statuses) <= 4, statuses  # 32 MiB, then refused
        assert body["message"].startswith("you wrote more than 32 MiB to the log lately")
    finally:
        assert server.stop() == 0


def test_requests_refused_for_their_size_are_metered_too(tmp_path: Path) -> None:
    """atk44w F5, atk44z F9: a 1.2 MB submit refused 413 (its event over the bound) was never
    charged: one user looped 1,033 of them with no 429 while another's submits went 22x
    slower. Each is charged its body now: past 32 MiB of them, 429."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    alice = make_token(home, "--user", "alice")
    server = start_server(home)
    try:
        body = {"actor": "", "account": "ai2/olmo", "gpus": 1,
                "command": ["/bin/true", *["x" * 4000] * 300]}  # fmt: skip
        statuses = []
        for _ in range(40):  # ~1.2 MB each: 32 MiB is ~28 of them
            status, answer = server.request("POST", "/v1/commands/submit", body, alice)
            statuses.append(status)
            if status != 413:
                break
        assert statuses[-1] == 429 and 20 <= len(statuses) <= 32, statuses
        assert answer["message"].startswith("you wrote more than 32 MiB to the log lately")
    finally:
        assert server.stop() == 0


def test_an_array_past_the_request_bound_is_refused_at_once_and_charged_its_claim(
    tmp_path: Path,
) -> None:
    """atk45-25 F6: a 60 KB submit of a 10,000-task array of a 1.7 KB command built 16 MiB of
    events before its 413 and was charged its body: a plain user's loops slowed another's
    submits 300x. Refused once decoded (what it writes at least is past the bound), and charged
    what it claimed it would write: a 20 MiB burst takes two such refusals, then 429."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    alice, bob = (make_token(home, "--user", who) for who in ("alice", "bob"))
    server = start_server(home, env={"GPULEDGER_WRITE_BURST": str(20 << 20)})
    try:
        body = {"actor": "", "account": "ai2/olmo", "gpus": 1, "array": list(range(10_000)),
                "command": ["/bin/true", "y" * 1700]}  # fmt: skip
        answers = [server.request("POST", "/v1/commands/submit", body, alice) for _ in range(3)]
        assert [status for status, _ in answers] == [413, 413, 429], answers
        assert "would write more than 16,777,216 bytes" in answers[0][1]["message"]
        assert "(at least 17," in answers[0][1]["message"], answers[0][1]  # before it is built
        assert answers[2][1]["message"].startswith("you wrote more than 20 MiB to the log lately")
        small = {"actor": "", "account": "ai2/olmo", "gpus": 1, "command": ["/bin/true"]}
        assert server.request("POST", "/v1/commands/submit", small, bob)[0] == 200
    finally:
        assert server.stop() == 0


def test_a_request_refused_for_what_it_built_is_charged_its_claim(tmp_path: Path) -> None:
    """atk45-25 F6: a request refused 413 once its events were built (an environment, which its
    floor does not count: 100 tasks of 250 KB each) was charged its 250 KB body. Charged what it
    reserved, a submit and a batch alike: a 20 MiB burst takes two, then 429."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    alice, bob = (make_token(home, "--user", who) for who in ("alice", "bob"))
    server = start_server(home, env={"GPULEDGER_WRITE_BURST": str(20 << 20)})
    try:
        env = {f"V{i}": "e" * 16_000 for i in range(16)}
        task = {"actor": "", "account": "ai2/olmo", "gpus": 1, "array": list(range(100)),
                "command": ["/bin/true"], "env": env}  # fmt: skip
        for token, path, body in (
            (alice, "/v1/commands/submit", task),
            (bob, "/v1/batch", {"commands": [{**task, "op": "submit"}]}),
        ):
            answers = [server.request("POST", path, body, token) for _ in range(3)]
            assert [status for status, _ in answers] == [413, 413, 429], (path, answers)
            assert "would write more than 16,777,216" in answers[0][1]["message"], answers[0]
    finally:
        assert server.stop() == 0


def test_concurrent_writes_pass_the_burst_by_one_request_at_most(tmp_path: Path) -> None:
    """atk44z F2: the meter was checked before a write and charged after it, so every request
    admitted while the earlier ones were still being committed wrote: 16 concurrent submits of
    ~15 MiB each wrote 136 MiB against a 32 MiB burst. Each reserves what it may write first:
    together they pass the burst by one request at most (burst 8 MiB here, ~4 MiB requests),
    and a person's concurrent small submits are all answered."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    bob = make_token(home, "--user", "bob")
    burst = 8 << 20
    server = start_server(home, env={"GPULEDGER_WRITE_BURST": str(burst)})
    try:
        statuses: list[int] = []

        def at_once(body: dict[str, Any], n: int = 16) -> list[int]:
            barrier = threading.Barrier(n)

            def one() -> int:
                barrier.wait()
                return server.request("POST", "/v1/commands/submit", body, bob)[0]

            with ThreadPoolExecutor(n) as pool:
                return list(pool.map(lambda _i: one(), range(n)))

        small = {"actor": "", "account": "ai2/olmo", "gpus": 1, "command": ["/bin/true"]}
        assert at_once(small) == [200] * 16  # a reservation is what the write may be
        wide = ["/bin/true", *["q" * 4000] * 64]  # 256 KB
        big = {**small, "command": wide, "array": list(range(16))}  # ~4 MiB written
        statuses = at_once(big)
        assert set(statuses) <= {200, 429}, statuses
        accepted = statuses.count(200)
        assert 1 <= accepted <= burst // (4 << 20) + 1, statuses  # was up to 16
    finally:
        assert server.stop() == 0


def test_a_person_past_the_meter_may_still_cancel_and_hold_her_jobs(tmp_path: Path) -> None:
    """atk44z F5: past the write meter a person's cancel of the array she had just submitted
    by mistake was refused for the whole debt (106 s there) while those jobs could be placed
    and charged. Cancels, holds and token revocations only end what a metered write made:
    never refused by the meter (still charged); her next submit is."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    bob = make_token(home, "--user", "bob")
    server = start_server(home, env={"GPULEDGER_WRITE_BURST": str(2 << 20)})
    try:
        wide = ["/bin/true", *["k" * 4000] * 64]  # 256 KB
        body = {"actor": "", "account": "ai2/olmo", "gpus": 8, "command": wide,
                "array": list(range(12))}  # fmt: skip  # ~3 MiB: past the 2 MiB burst
        status, answer = server.request("POST", "/v1/commands/submit", body, bob)
        assert status == 200, answer
        first = int(answer["events"][0]["job_id"])
        status, answer = server.request("POST", "/v1/commands/submit", body, bob)
        assert status == 429, answer  # past the meter
        hold = {"actor": "", "job_id": first + 1}
        status, answer = server.request("POST", "/v1/commands/hold", hold, bob)
        assert status == 200, answer  # was 429
        cancel = {"actor": "", "job_id": first, "whole_array": True}
        status, answer = server.request("POST", "/v1/commands/cancel", cancel, bob)
        assert status == 200, answer  # was 429 "you wrote more than 2 MiB to the log lately"
        assert len(answer["events"]) == 12, answer
        small = {"actor": "", "account": "ai2/olmo", "gpus": 1, "command": ["/bin/true"]}
        status, answer = server.request("POST", "/v1/commands/submit", small, bob)
        assert status == 429, answer  # the meter still holds her writes
    finally:
        assert server.stop() == 0
