"""Red team, what a request and a person write to the log (atk44-25): a 1.2 MB submit made an
event the Kafka broker refused and the relay stopped for good (F8); an array of 1,000 tasks of a
105 KB command wrote 186 MiB and answered 100 MB (F12); a user looping max-size submits grew the
log ~15 MiB/s and slowed another's submits ~190x (F9). A real server: each is one line, nothing
appended, and another person's submits are answered. Each refusal here was a 200 before."""

from __future__ import annotations

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
        assert 30 <= accepted <= 45, accepted  # 32 MiB of them, then one line
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
