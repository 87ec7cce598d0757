"""Red team, one user filling the queue (F8 of the attack on issue 25: three 10,000-task arrays
put 30,000 pending jobs in the log and slowed every cycle): the site caps the unfinished jobs one
user may own and the tasks of one array (serve.toml `max_jobs_per_user`, `max_array_size`, like
Slurm's MaxSubmitJobs and MaxArraySize); past either, one 403 line and nothing appended."""

from __future__ import annotations

from pathlib import Path

from tests.integration.serverkit import make_token, set_up_ledger, start_server


def test_a_user_past_the_sites_job_and_array_limits_gets_one_line(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)  # job 1 by alice, pending
    config = tmp_path / "serve.toml"
    config.write_text("max_jobs_per_user = 5\nmax_array_size = 3\n")
    alice, bob = (make_token(home, "--user", who) for who in ("alice", "bob"))
    server = start_server(home, "--config", str(config))
    try:

        def submit(token: str, **extra: object) -> tuple[int, object]:
            body = {"actor": "", "account": "ai2/olmo", "gpus": 1, **extra}
            return server.request("POST", "/v1/commands/submit", body, token)

        status, body = submit(alice, array=[0, 1, 2, 3])
        assert status == 403 and isinstance(body, dict), body
        assert body["message"] == (
            "an array of 4 tasks is more than the 3 one array may have here (max_array_size)"
        )
        status, body = submit(alice, array=[0, 1, 2])
        assert status == 200, body  # alice: job 1 and these 3
        assert submit(alice)[0] == 200  # 5
        _, before = server.request("GET", "/v1/health")
        status, body = submit(alice)
        assert status == 403 and isinstance(body, dict), body
        assert body["message"] == (
            "'alice' has 5 unfinished jobs, and 1 more would pass the 5 one user may have here "
            "(max_jobs_per_user)"
        )
        _, after = server.request("GET", "/v1/health")
        assert isinstance(before, dict) and isinstance(after, dict)
        assert after["head"] == before["head"]  # nothing appended
        assert submit(bob)[0] == 200  # the limit is per user
        status, _ = server.request("POST", "/v1/commands/cancel", {"actor": "", "job_id": 1}, alice)
        assert status == 200
        assert submit(alice)[0] == 200  # one ended: one more fits
    finally:
        assert server.stop() == 0


def test_a_user_past_the_bytes_her_unfinished_jobs_may_hold_gets_one_line(
    tmp_path: Path,
) -> None:
    """atk44z F7: nothing bounded the bytes of a person's unfinished jobs, which the server
    holds in memory: 20,000 jobs of a 900 KiB command were taken (~40 GB of its memory)."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)  # job 1 by alice, pending
    config = tmp_path / "serve.toml"
    config.write_text(f"max_job_bytes_per_user = {4 << 20}\n")  # 4 MiB
    alice, bob = (make_token(home, "--user", who) for who in ("alice", "bob"))
    server = start_server(home, "--config", str(config))
    big = ["/bin/true", *["x" * 4000] * 200]  # 800 KB
    try:

        def submit(token: str, **extra: object) -> tuple[int, object]:
            body = {"actor": "", "account": "ai2/olmo", "gpus": 1, "command": big, **extra}
            return server.request("POST", "/v1/commands/submit", body, token)

        assert [submit(alice)[0] for _ in range(5)] == [200] * 5  # ~3.8 MiB
        status, body = submit(alice)
        assert status == 403 and isinstance(body, dict), body
        assert body["message"].startswith("'alice''s unfinished jobs hold 3.8 MiB"), body
        assert body["message"].endswith("4.0 MiB one user may have here (max_job_bytes_per_user)")
        status, body = submit(alice, array=[0, 1])
        assert status == 403, body
        assert submit(bob)[0] == 200  # per user
        status, body = server.request(
            "POST", "/v1/commands/cancel", {"actor": "", "job_id": 2}, alice
        )
        assert status == 200, body
        assert submit(alice)[0] == 200  # one ended: one more fits
    finally:
        assert server.stop() == 0
