"""Who a job runs as (`ledger.core.runas`): a ledger user maps to an OS account only when one
exists with a uid at or above the minimum; root only for root's own jobs when the site allows
it; only admins add system accounts as members; secrets never travel in a job's environment."""

from __future__ import annotations

import pytest

from ledger.core.runas import OsAccount, RunAs, admit
from ledger.core.state import State
from schemas import commands as c
from schemas.errors import NotAuthorised

ACCOUNTS = {
    "root": OsAccount("root", 0, 0),
    "daemon": OsAccount("daemon", 1, 1),
    "alice": OsAccount("alice", 1001, 1001, "/home/alice", "/bin/bash"),
    "asmith": OsAccount("asmith", 1500, 100),
    "svc": OsAccount("svc", 999, 999),
    "slurm": OsAccount("slurm", 64030, 64030, "/nonexistent", "/bin/false"),
    "nobody": OsAccount("nobody", 65534, 65534, "/nonexistent", "/usr/sbin/nologin"),
    "dyn": OsAccount("dyn", 61000, 61000, "/home/dyn", "/bin/sh"),
    "svc2": OsAccount("svc2", 1200, 1200, "/var/lib/svc2", "/usr/sbin/nologin"),
    "dave": OsAccount("dave", 1005, 1005, "/home/dave", "/bin/bash", ("dave", "sudo")),
}


def lookup(name: str) -> OsAccount | None:
    return ACCOUNTS.get(name)


@pytest.mark.parametrize(
    ("rule", "user", "want"),
    [
        (RunAs(), "alice", "alice"),
        (RunAs(accounts={"al": "asmith"}), "al", "asmith"),
        (RunAs(root_jobs=True), "root", "root"),
        (RunAs(min_uid=900), "svc", "svc"),
    ],
    ids=["own account", "mapped", "root's own, allowed", "a site's lower minimum"],
)
def test_a_user_runs_as_a_persons_account(rule: RunAs, user: str, want: str) -> None:
    assert rule.account(user, lookup).name == want


@pytest.mark.parametrize(
    ("rule", "user", "want"),
    [
        (RunAs(), "bob", "'bob' has no OS account here"),
        (RunAs(accounts={"bob": "nobody-here"}), "bob", "'bob' (mapped to 'nobody-here') has no"),
        (RunAs(), "root", "jobs of 'root' would run as root"),
        (RunAs(root_jobs=True, accounts={"eve": "root"}), "eve", "jobs of 'eve' (mapped to"),
        (RunAs(), "daemon", "'daemon' is a system account (uid 1 < min_uid 1000)"),
        (RunAs(), "svc", "'svc' is a system account (uid 999 < min_uid 1000)"),
        (RunAs(), "slurm", "'slurm' is a system account (uid 64030 > max_uid 60000)"),
        (RunAs(), "nobody", "'nobody' is a system account (uid 65534 > max_uid 60000)"),
        (RunAs(), "dyn", "'dyn' is a system account (uid 61000 > max_uid 60000)"),
        (RunAs(), "svc2", "'svc2' is a system account (its shell is /usr/sbin/nologin)"),
    ],
    ids=[
        "no account",
        "mapped to none",
        "root",
        "mapped to root",
        "system",
        "below min",
        "slurm above max",
        "nobody",
        "dynamic system range",
        "nologin",
    ],
)
def test_no_job_runs_as_an_account_the_rule_refuses(rule: RunAs, user: str, want: str) -> None:
    with pytest.raises(NotAuthorised, match=want.replace("(", r"\(").replace(")", r"\)")):
        rule.account(user, lookup)


def _state() -> State:
    state = State(initialised=True)
    state.admins.add("root")
    return state


def test_a_sudoer_runs_their_own_jobs_but_only_an_admin_adds_them() -> None:
    assert RunAs().account("dave", lookup).name == "dave"
    state, rule = _state(), RunAs()
    add = c.AddMember(actor="mgr", user="dave", project="p/q")
    with pytest.raises(NotAuthorised, match="'dave': it is a system account \\(in group sudo\\)"):
        admit(state, add, lookup=lookup, rule=rule, submissions=False)


def test_the_journals_and_the_sites_own_groups_have_the_systems_rights_too() -> None:
    """atk23d F11: a manager added members of `systemd-journal` (the whole journal, as `adm`),
    `ssl-cert` (TLS private keys) and the site's PostgreSQL account's group, and ran jobs as
    them; the list was fixed, with no setting."""
    from ledger.core.runas import PRIVILEGED_GROUPS

    state = _state()
    for group in ("systemd-journal", "ssl-cert"):
        who = OsAccount("erin", 1006, 1006, "/home/erin", "/bin/bash", ("erin", group))
        add = c.AddMember(actor="mgr", user="erin", project="p/q")
        with pytest.raises(NotAuthorised, match=f"in group {group}"):
            admit(state, add, lookup=lambda n, w=who: w, rule=RunAs(), submissions=False)  # type: ignore[misc]
    site = OsAccount("erin", 1006, 1006, "/home/erin", "/bin/bash", ("erin", "gpuledger-pg"))
    add = c.AddMember(actor="mgr", user="erin", project="p/q")
    assert admit(state, add, lookup=lambda n: site, rule=RunAs(), submissions=False) is add
    rule = RunAs(privileged_groups=PRIVILEGED_GROUPS | {"gpuledger-pg"})
    with pytest.raises(NotAuthorised, match="in group gpuledger-pg"):
        admit(state, add, lookup=lambda n: site, rule=rule, submissions=False)


def test_only_an_admin_adds_a_system_account_as_a_member() -> None:
    state, rule = _state(), RunAs()
    add = c.AddMember(actor="mgr", user="root", project="p/q")
    with pytest.raises(NotAuthorised, match="'mgr' may not add 'root': it is a system account"):
        admit(state, add, lookup=lookup, rule=rule, submissions=False)
    for user in ("alice", "someone-without-an-account"):
        ok = c.AddMember(actor="mgr", user=user, project="p/q")
        assert admit(state, ok, lookup=lookup, rule=rule, submissions=False) is ok
    for system in ("slurm", "nobody", "dyn", "svc2", "dave"):  # F3: above max_uid, nologin, sudo
        add = c.AddMember(actor="mgr", user=system, project="p/q")
        with pytest.raises(NotAuthorised, match=f"may not add '{system}': it is a system acc"):
            admit(state, add, lookup=lookup, rule=rule, submissions=False)
    by_admin = c.AddMember(actor="root", user="daemon", project="p/q")
    assert admit(state, by_admin, lookup=lookup, rule=rule, submissions=False) is by_admin


def test_a_submission_is_refused_when_its_owner_may_not_run_jobs() -> None:
    state, rule = _state(), RunAs()
    cmd = c.SubmitJob(actor="bob", account="p/q", gpus=1)
    with pytest.raises(NotAuthorised, match="'bob' has no OS account"):
        admit(state, cmd, lookup=lookup, rule=rule, submissions=True)
    on_behalf = c.SubmitJob(actor="root", user="daemon", account="p/q", gpus=1)
    with pytest.raises(NotAuthorised, match="system account"):
        admit(state, on_behalf, lookup=lookup, rule=rule, submissions=True)
    # when jobs do not run as their owners (service mode, no executor), nothing is asked
    assert admit(state, cmd, lookup=lookup, rule=rule, submissions=False) is cmd


@pytest.mark.parametrize(
    ("actor", "want"),
    [
        ("root", "'alice' may not act as 'root': only admins may use --as"),
        ("@dispatcher", "'alice' may not act as '@dispatcher': system actors cannot be taken on"),
    ],
)
def test_acting_as_someone_else_is_refused_before_the_run_as_rule(actor: str, want: str) -> None:
    """F13 of the attack on issue 25: a plain user's submission as root was refused with the
    run-as rule's words (which tell a tenant how the service runs jobs), not as impersonation."""
    state, rule = _state(), RunAs()
    cmd = c.SubmitJob(actor=actor, real_actor="alice", account="p/q", gpus=1)
    with pytest.raises(NotAuthorised) as err:
        admit(state, cmd, lookup=lookup, rule=rule, submissions=True)
    assert err.value.message == want


def test_secrets_never_reach_the_log() -> None:
    state, rule = _state(), RunAs()
    env = {"PATH": "/bin", "GPULEDGER_TOKEN": "glt_x", "MY_API_KEY": "k", "HOME": "/h"}
    cmd = c.SubmitJob(actor="alice", account="p/q", gpus=1, env=env)
    got = admit(state, cmd, lookup=lookup, rule=rule, submissions=True)
    assert isinstance(got, c.SubmitJob) and got.env == {"PATH": "/bin", "HOME": "/h"}
    site = admit(state, cmd, lookup=lookup, rule=rule, submissions=True, secret="^HOME$")
    assert isinstance(site, c.SubmitJob) and "HOME" not in site.env and "MY_API_KEY" in site.env


def test_a_member_who_gains_the_systems_rights_later_is_not_run_as_by_a_manager() -> None:
    """N1 of the re-test of issue 23: a manager added dave while he was a person's account;
    he joined `sudo` later, and her `submit --user dave` ran `id` as him. The rule is asked at
    each submission (and before each launch, `Dispatcher.launch`) with his groups as they are."""
    state, rule = _state(), RunAs()
    as_dave = c.SubmitJob(actor="mgr", user="dave", account="p/q", gpus=1)
    with pytest.raises(NotAuthorised) as err:
        admit(state, as_dave, lookup=lookup, rule=rule, submissions=True)
    assert err.value.message.startswith("'mgr' may not run jobs as 'dave': it has the system's")
    with pytest.raises(NotAuthorised, match="group sudo"):
        rule.account("dave", lookup, by="mgr")
    # his own jobs, and an admin's on his behalf, still run as him
    own = c.SubmitJob(actor="dave", account="p/q", gpus=1)
    assert admit(state, own, lookup=lookup, rule=rule, submissions=True) is own
    by_admin = c.SubmitJob(actor="root", user="dave", account="p/q", gpus=1)
    assert admit(state, by_admin, lookup=lookup, rule=rule, submissions=True) is by_admin
    assert rule.account("alice", lookup, by="mgr").name == "alice"


@pytest.mark.parametrize("group", ["shadow", "disk", "kmem", "sys", "docker", "lxd", "libvirt"])
def test_groups_that_read_or_write_as_root_are_the_systems(group: str) -> None:
    """N2 of the re-test of issue 23: a member in `shadow` and `disk` was added by a manager,
    and her job as him printed /etc/shadow."""
    eve = OsAccount("eve", 1013, 1013, "/home/eve", "/bin/bash", ("eve", group))
    state, rule = _state(), RunAs()
    add = c.AddMember(actor="mgr", user="eve", project="p/q")
    with pytest.raises(NotAuthorised, match=f"it is a system account \\(in group {group}\\)"):
        admit(state, add, lookup={"eve": eve}.get, rule=rule, submissions=False)
    as_eve = c.SubmitJob(actor="mgr", user="eve", account="p/q", gpus=1)
    with pytest.raises(NotAuthorised, match=f"group {group}"):
        admit(state, as_eve, lookup={"eve": eve}.get, rule=rule, submissions=True)


def test_a_launch_asks_the_rule_again_with_the_groups_as_they_are_now() -> None:
    """N1 of the re-test of issue 23: a job a manager queued as dave before he joined `sudo`
    ends `launch_failed` with why, at launch, instead of running as him."""
    from types import SimpleNamespace

    from ledger.core.state import Job
    from ledger.cycle.dispatcher import Dispatcher
    from schemas import events as e

    state = _state()
    for n, (actor, user) in enumerate([("mgr", "dave"), ("dave", "dave"), ("root", "dave")], 1):
        spec = e.JobSubmitted(
            event_id=f"e{n}", at=0.0, actor=actor, job_id=n, account="p/q", user=user, gpus=1,
            min_runtime_s=0, command=("id",),
        )  # fmt: skip
        state.jobs[n] = Job(spec=spec, status="placed")
    recorded: list[c.AnyCommand] = []
    ledger = SimpleNamespace(state=state, execute=recorded.append)
    d = Dispatcher(ledger, None, None, None, run_as=RunAs(), lookup=lookup)  # type: ignore[arg-type]
    launched = d._launches([1, 2, 3])
    assert [x.job_id for x in launched] == [2, 3] and {x.user for x in launched} == {"dave"}
    (finish,) = recorded
    assert isinstance(finish, c.FinishJob) and finish.job_id == 1
    assert finish.reason == "launch_failed" and "'mgr' may not run jobs as 'dave'" in finish.note


def test_the_server_strips_auth_cookies_and_connection_keys_but_keeps_credentials_paths() -> None:
    """N9 and F10's remainder, at the server (a client that sends them anyway): nothing of
    them reaches the log; a credentials file's path does."""
    state, rule = _state(), RunAs()
    env = {"GOOGLE_APPLICATION_CREDENTIALS": "/h/sa.json", "NPM_AUTH": "x", "HF_AUTH": "x",
           "SESSION_COOKIE": "x", "CONN": "Endpoint=sb://h/;SharedAccessKey=x",
           "HOOK": "https://hooks.slack.com/services/T0/B0/x"}  # fmt: skip
    cmd = c.SubmitJob(actor="alice", account="p/q", gpus=1, env=env)
    got = admit(state, cmd, lookup=lookup, rule=rule, submissions=True)
    assert isinstance(got, c.SubmitJob) and got.env == {
        "GOOGLE_APPLICATION_CREDENTIALS": "/h/sa.json"
    }
