"""`report preemptions` counts by one rule (the README's, the Preemptions page's, /metrics'): a
preemption is suffered by the subtree of its victim and caused by the subtree of the job it was
for, both when both are in it; a job belongs to its account and to its user's node below it.
Over a real simulated history (the docs' quick run), with the CLI as a user types it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.serverkit import cli, make_token, start_server

WHOLE = ("--since", "2000-01-01T00:00:00Z", "--at", "2100-01-01T00:00:00Z")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("quick") / "ledger"
    cli(
        home, "--home", str(home), "simulate", "run", "--synthetic", "--days", "1",
        "--programs", "2", "--teams", "4", "--users", "12", "--nodes", "6", "--no-plots",
        timeout=600, GPULEDGER_USER="root",
    )  # fmt: skip
    return home


def report(home: Path, *args: str) -> dict[str, Any]:
    out = cli(home, "report", "preemptions", *WHOLE, "--json", *args, GPULEDGER_USER="root")
    got: dict[str, Any] = json.loads(out.stdout)
    return got


def under(account: str | None, top: str) -> bool:
    return account is not None and (account == top or account.startswith(top + "/"))


def test_caused_counts_the_preemptions_inside_a_team_too(home: Path) -> None:
    everything = report(home)
    rows = everything["rows"]
    assert rows, "the quick run preempts nothing: the test would prove nothing"
    assert everything["suffered"] == len(rows)
    assert everything["caused"] == sum(r["for_job"] is not None for r in rows)
    inside = [r for r in rows if r["for_account"] and r["for_account"] == r["account"]]
    assert inside, "no preemption inside a team: the test would prove nothing"
    teams = {"/".join(r["account"].split("/")[:2]) for r in rows} | {
        "/".join(r["for_account"].split("/")[:2]) for r in rows if r["for_account"]
    }
    for team in sorted(teams):
        by = report(home, "-A", team, "--by")
        want = [r["position"] for r in rows if under(r["for_account"], team)]
        assert [r["position"] for r in by["rows"]] == want, team
        assert by["caused"] == len(want)
        lost = sum(r["lost_gpu_hours"] for r in rows if under(r["for_account"], team))
        assert abs(by["caused_lost_gpu_hours"] - lost) < 1e-6, (team, by)  # atk29c F4
        of = report(home, "-A", team, "--of")
        want_of = [r["position"] for r in rows if under(r["account"], team)]
        assert [r["position"] for r in of["rows"]] == want_of and of["suffered"] == len(want_of)
        both = report(home, "-A", team)
        assert {r["position"] for r in both["rows"]} == set(want) | set(want_of)
        assert both["caused"] == len(want) and both["suffered"] == len(want_of)
        for r in both["rows"]:
            mine, theirs = under(r["account"], team), under(r["for_account"], team)
            assert r["side"] == ("both" if mine and theirs else "suffered" if mine else "caused")


def test_a_persons_node_finds_the_persons_preemptions(home: Path) -> None:
    rows = report(home)["rows"]
    r = rows[0]
    person = f"{r['account']}/{r['user_name']}"
    got = report(home, "-A", person, "--of")
    want = [
        x["position"]
        for x in rows
        if (x["account"], x["user_name"]) == (r["account"], r["user_name"])
    ]
    assert [x["position"] for x in got["rows"]] == want and got["suffered"] == len(want) >= 1
    assert all(x["user_name"] == r["user_name"] for x in got["rows"])


def test_metrics_and_the_page_count_caused_as_the_cli_does(home: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    token = make_token(home, "--user", "root")
    server = start_server(home, "--interval", "1h")

    def scrape() -> dict[str, float]:
        status, raw = server.request("GET", "/metrics", token=token)
        assert status == 200
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        caused: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for x in fam.samples:
                if x.name == "kueue_preempted_workloads_total":
                    t = x.labels["preempting_cluster_queue"]
                    caused[t] = caused.get(t, 0) + x.value
        return caused

    try:
        for _ in range(5):  # the three read while nothing moved
            caused = scrape()
            teams = sorted(t for t in caused if t)
            cli_by = {t: report(home, "-A", t, "--by")["caused"] for t in teams}
            page_by: dict[str, Any] = {}
            for t in teams:
                status, page = server.request(
                    "GET", f"/ui/api/preemptions?account={t}&side=by&window=all", token=token
                )
                assert status == 200, page
                page_by[t] = page["report"]["caused"]
            rows = report(home)["rows"]
            if scrape() == caused:
                break
        assert teams and cli_by == page_by == {t: caused[t] for t in teams}
        assert sum(caused.values()) == len(rows)
    finally:
        assert server.stop() == 0, server.log_path.read_text()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--by", "--of"), "error: --by and --of are one or the other"),
        (("--since", "2030-01-01T00:00:00Z", "--at", "2026-12-02T00:00:00Z"),
         "error: --since 2030-01-01 00:00:00Z is not before the end of the period"),
        (("--window", "99999d"), "error: invalid --window '99999d': at most 3650d (ten years)"),
        (("-A", "nope"), "error: no account 'nope' (see `gpuledger account tree`)"),
        # atk48-29 F5: one or the other, as --by --of; a window before 1970 names what was given
        (("--window", "30d", "--since", "2026-12-01T00:00:00Z"),
         "error: --window and --since are one or the other"),
        (("--at", "1970-01-01T00:00:00Z"),
         "error: --window 30d before --at 1970-01-01 00:00:00Z starts before 1970"),
    ],
)  # fmt: skip
def test_a_report_that_cannot_be_is_refused_in_one_line(
    home: Path, args: tuple[str, ...], said: str
) -> None:
    """`--by --of` together, an inverted period, a window past the bound (told in days, the unit
    given) and an unknown account (the hint names a command that exists) are one error line."""
    got = cli(home, "report", "preemptions", *args, ok=False, GPULEDGER_USER="root")
    assert got.returncode != 0 and got.stderr.startswith(said), got.stderr
    assert len(got.stderr.strip().splitlines()) == 1, got.stderr
    hint = got.stderr.split("(see `", 1)[-1].split("`", 1)[0]
    if hint.startswith("gpuledger "):  # the hint's command exists
        assert cli(home, *hint.split()[1:], GPULEDGER_USER="root").returncode == 0
