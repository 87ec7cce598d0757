"""Pure parts of the metrics and the dashboard: the exposition of one reading, team names, who
sees a job's command, redaction and chart buckets."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledger.core.decide import decide
from ledger.core.evolve import evolve
from ledger.core.state import State
from ledger.reads.layer import may_see_private, redact
from ledger.server import metrics as m
from ledger.server.pages import bucket_for
from schemas import commands as c
from schemas import views as v

FIGURES = m.Figures(
    now=1000.0,
    head=42,
    cycles=7,
    projection_position=40,
    projection_lag_s=3.5,
    relay_lag=None,
    queue_by_code={"NEXT_CYCLE": 2, "WAIT_CAPACITY": 5},
    queue_by_team={"ai2/olmo": 6, "ai2/tulu": 1},
    placements={"funded": 9, "unfunded": 1},
    preemptions={"fairness": 3},
    teams=[
        m.TeamFigures(
            team="ai2/olmo",
            usage_gpu_hours=12.5,
            owed_gpu_hours=10.0,
            delivered_gpu_hours=12.5,
            level_fs=0.8,
        ),
        m.TeamFigures(team="ai2/tulu", level_fs=None),
    ],
    heartbeat_ages={"n1": 10.0},
)


def samples(figures: m.Figures) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    metrics = m.Metrics(lambda err: 500)
    text = metrics.render(figures).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_one_reading_is_exposed_with_every_family() -> None:
    got = samples(FIGURES)
    assert got[("gpuledger_queue_jobs", (("code", "WAIT_CAPACITY"),))] == 5
    assert got[("gpuledger_queue_jobs_by_team", (("team", "ai2/olmo"),))] == 6
    assert got[("gpuledger_placements_total", (("kind", "funded"),))] == 9
    assert got[("gpuledger_preemptions_total", (("reason", "fairness"),))] == 3
    assert got[("gpuledger_team_delivered_gpu_hours", (("team", "ai2/olmo"),))] == 12.5
    assert got[("gpuledger_team_level_fs", (("team", "ai2/tulu"),))] == float("inf")
    assert got[("gpuledger_projection_lag_events", ())] == 2
    assert got[("gpuledger_projection_lag_seconds", ())] == 3.5
    assert got[("gpuledger_node_heartbeat_age_seconds", (("node", "n1"),))] == 10.0
    assert got[("gpuledger_cycles_total", ())] == 7
    assert not any(name == "gpuledger_relay_lag_events" for name, _ in got)  # no Kafka
    assert not any(name.endswith("_created") for name, _ in got)
    with_relay = samples(FIGURES.__class__(**{**_fields(FIGURES), "relay_lag": 4}))
    assert with_relay[("gpuledger_relay_lag_events", ())] == 4


def _fields(f: m.Figures) -> dict[str, object]:
    return {k: getattr(f, k) for k in f.__struct_fields__}


def test_the_role_the_epoch_and_every_servers_lag_are_exposed() -> None:
    alone = samples(FIGURES)
    assert alone[("gpuledger_server_role", (("role", "single"),))] == 1
    assert alone[("gpuledger_server_role", (("role", "leader"),))] == 0
    assert alone[("gpuledger_leader_epoch", ())] == 0
    lags = {"http://a:1": 0, "http://b:2": 7}
    shared = FIGURES.__class__(**{**_fields(FIGURES), "role": "standby", "epoch": 3,
                                  "server_lags": lags})  # fmt: skip
    got = samples(shared)
    assert got[("gpuledger_server_role", (("role", "standby"),))] == 1
    assert got[("gpuledger_server_role", (("role", "single"),))] == 0
    assert got[("gpuledger_leader_epoch", ())] == 3
    assert got[("gpuledger_server_lag_events", (("server", "http://b:2"),))] == 7


def test_cycles_are_observed() -> None:
    metrics = m.Metrics(lambda err: 500)
    metrics.observe_cycle(0.02)
    metrics.observe_cycle(3.0)
    text = metrics.render(FIGURES).decode()
    assert 'gpuledger_cycle_seconds_bucket{le="0.025"} 1.0' in text
    assert "gpuledger_cycle_seconds_count 2.0" in text


def test_team_of_takes_the_first_two_parts() -> None:
    assert m.team_of("ai2/olmo/alice") == "ai2/olmo"
    assert m.team_of("ai2") == "ai2"


def _state() -> State:
    state = State()
    n = itertools.count()
    for cmd in (
        c.InitLedger(actor="root", admin="root"),
        c.OpenAccount(actor="root", path="ai2", kind="program"),
        c.OpenAccount(actor="root", path="ai2/olmo", kind="project"),
        c.OpenAccount(actor="root", path="ai2/tulu", kind="project"),
        c.AddMember(actor="root", user="alice", project="ai2/olmo"),
        c.AddMember(actor="root", user="carol", project="ai2/tulu"),
        c.GrantManager(actor="root", user="boss", account="ai2"),
        c.GrantManager(actor="root", user="tulumgr", account="ai2/tulu"),
    ):
        for ev in decide(state, cmd, 1.0, lambda: f"e{next(n)}"):
            evolve(state, ev)
    return state


def test_only_the_owner_managers_above_and_admins_see_a_jobs_command() -> None:
    state = _state()
    who = {
        actor: may_see_private(state, actor, "alice", "ai2/olmo")
        for actor in ("alice", "carol", "boss", "tulumgr", "root", "stranger")
    }
    assert who == {
        "alice": True,
        "carol": False,
        "boss": True,
        "tulumgr": False,
        "root": True,
        "stranger": False,
    }


def test_redact_drops_the_command_and_logs_only() -> None:
    row = v.JobRow(
        job_id=1, account="ai2/olmo", user="alice", gpus=1, gpu_type=None, cluster=None,
        status="running", outcome=None, exit_code=None, funded=True, min_runtime_s=0,
        resumable=False, priority=0, debug=False, time_limit_s=None, submitted_at=1.0,
        placed_at=2.0, started_at=2.0, finished_at=None, elapsed_s=1.0, nodes=["n1"],
        placements=1, preemptions=0, command=["python", "secret.py"], logs=["/logs/1.out"],
        workdir="/home/alice/secret-proj", job_name="train",
    )  # fmt: skip
    hidden = redact(row)
    assert hidden.command == [] and hidden.logs == [] and hidden.redacted
    assert (hidden.workdir, hidden.job_name) == ("", "train")  # its name is public, as in squeue
    failed = msgspec.structs.replace(
        row, status="finished", finish_reason="launch_failed", finish_note="cannot enter /home/a"
    )
    assert redact(failed).finish_note == ""
    lost = msgspec.structs.replace(
        row, status="finished", finish_reason="node_lost", finish_note="node n1 lost: psu"
    )
    assert redact(lost).finish_note == "node n1 lost: psu"
    assert (hidden.job_id, hidden.user, hidden.nodes, hidden.status) == (
        1,
        "alice",
        ["n1"],
        "running",
    )


def test_chart_buckets_are_whole_hours() -> None:
    assert bucket_for(7 * 86400) == 4 * 3600
    assert bucket_for(3600) == 3600
    assert bucket_for(365 * 86400) % 3600 == 0


@pytest.mark.parametrize(
    ("case", "projected", "unprojected", "want_lag_s"),
    [
        ("the read's projection holds the view: no lag", 10, (8, 90.0), 0.0),
        ("behind the view: since the first event lacked", 7, (8, 90.0), 10.0),
        ("behind, nothing known of the events lacked", 7, None, 0.0),
    ],
)
def test_the_projection_lag_of_a_scrape_is_the_views(
    case: str, projected: int, unprojected: tuple[int, float] | None, want_lag_s: float
) -> None:
    from ledger.core.state import State
    from ledger.server.copied import Copy, Frozen
    from ledger.server.metrics import projection_lag_s

    view = Copy(Frozen(State(), 10), 100.0, {}, unprojected=unprojected)
    assert projection_lag_s(view, projected) == want_lag_s, case
