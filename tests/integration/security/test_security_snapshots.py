"""Red team, someone with store file access forging a snapshot (threat model row T7,
docs/security.md; F3 of the attack on issue 25): a root token and an admin added to a stored
snapshot's payload, its digest recomputed as plain SHA-256. The service refuses the snapshot
at start (it carries no MAC under the service's key, and it is not the fold of the log up to
its position), so the forged token is refused; `audit verify` names the snapshot, key or not."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path

import msgspec

from ledger.store.application import Ledger
from schemas import commands as c
from tests.integration.serverkit import cli, make_token, set_up_ledger, start_server

SECRET = "glt_deadbeefdeadbeef_" + "A" * 43


def _snapshot(home: Path) -> int:
    """A live ledger that folds 30 events and stores a snapshot; its position."""
    ledger = Ledger(home, live=True, snapshot_every=10)
    try:
        ledger.execute_all(
            [c.SubmitJob(actor="alice", account="ai2/olmo", gpus=1, min_runtime_s=0)] * 30
        )
        assert ledger.snapshot_state() or ledger.snapshot_position == ledger.position
        return ledger.position
    finally:
        ledger.close()


def _forge(home: Path, *, resign: bool = False) -> int:
    """Add a root token and the admin `mal` to every stored snapshot (the attacker's recipe);
    with `resign`, also recompute the MAC with the key read from the data directory (an
    attacker who holds the service's account). The newest snapshot's position."""
    con = sqlite3.connect(home / "events.sqlite")
    rows = con.execute("SELECT originator_version, state FROM stored_snapshots").fetchall()
    assert rows
    key = (home / "state.key").read_bytes()
    newest = 0
    for rowid, state in rows:
        d = msgspec.msgpack.decode(state)
        pl = msgspec.msgpack.decode(d["payload"])
        now = time.time()
        tok = dict(
            token_id="deadbeefdeadbeef",
            user="root",
            name="x",
            secret_sha256=hashlib.sha256(SECRET.encode()).hexdigest(),
            issued_at=now,
            expires_at=now + 86400,
        )
        pl["tokens"].append(tok)
        pl["admins"] = sorted({*pl["admins"], "mal"})
        d["payload"] = msgspec.msgpack.encode(pl)
        d["digest"] = hashlib.sha256(d["payload"]).hexdigest()
        if resign:
            import hmac

            head = f"gpuledger.snapshot.v1\0{d['position']}\0{d['version']}\0{d['chain_hash']}\0"
            d["mac"] = hmac.new(key, head.encode() + d["payload"], hashlib.sha256).hexdigest()
        con.execute(
            "UPDATE stored_snapshots SET state = ? WHERE originator_version = ?",
            (msgspec.msgpack.encode(d), rowid),
        )
        newest = max(newest, d["position"])
    con.commit()
    con.close()
    return newest


def test_a_forged_snapshot_is_refused_at_start_and_named_by_audit_verify(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    token = make_token(home, "--user", "bob")
    at = _snapshot(home)
    assert (home / "state.key").stat().st_mode & 0o777 == 0o600
    clean = cli(home, "audit", "verify")
    assert "chain intact" in clean.stdout, clean.stdout
    forged_at = _forge(home)
    assert forged_at == at

    server = start_server(home)
    try:
        status, body = server.request("GET", "/v1/whoami", token=SECRET)
        assert status == 401, body  # the forged token is not the ledger's
        status, body = server.request("GET", "/v1/whoami", token=token)
        assert status == 200 and body["actor"] == "bob" and body["admin"] is False, body
        status, body = server.request(
            "POST", "/v1/commands/admin.grant", {"actor": "mal", "user": "bob"}, token=None
        )
        assert status in (401, 403), body
    finally:
        assert server.stop() == 0
    log = (home.parent / "serve.log").read_text()
    assert f"the snapshot at position {at} is not the fold of the log up to it" in log, log[-2000:]

    verify = cli(home, "audit", "verify", ok=False)
    assert verify.returncode != 0, verify.stdout
    out = verify.stdout + verify.stderr
    assert f"position {at}: edited: the snapshot stored for this position is not the fold" in out


def test_a_snapshot_resigned_with_the_stolen_key_is_still_named_by_audit_verify(
    tmp_path: Path,
) -> None:
    """Whoever holds the service's account can read its key and sign a forgery: a start then
    trusts it (the price of a fast start), but `audit verify`, which refolds the log, names it."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    at = _snapshot(home)
    _forge(home, resign=True)
    verify = cli(home, "audit", "verify", ok=False)
    assert verify.returncode != 0
    assert f"position {at}: edited: the snapshot stored" in verify.stdout + verify.stderr


def test_a_genuine_snapshot_verifies_and_a_start_uses_it(tmp_path: Path) -> None:
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    at = _snapshot(home)
    ledger = Ledger(home, live=True)
    try:
        assert ledger.restored_from == at and ledger.refused_snapshot is None
    finally:
        ledger.close()
    assert "chain intact" in cli(home, "audit", "verify").stdout


def test_a_snapshot_edited_without_its_digest_is_named_by_audit_verify(tmp_path: Path) -> None:
    """atk47-25 F5: a user's name replaced inside the newest stored snapshot (same length, the
    digest left as it was): a start skips it with a warning, and `audit verify` said "chain
    intact", exit 0 (an unreadable snapshot was passed over). It names the row now."""
    home = tmp_path / "ledger"
    set_up_ledger(home, tmp_path)
    at = _snapshot(home)
    con = sqlite3.connect(home / "events.sqlite")
    (state,) = con.execute(
        "SELECT state FROM stored_snapshots ORDER BY originator_version DESC LIMIT 1"
    ).fetchone()
    assert b"alice" in state
    con.execute(
        "UPDATE stored_snapshots SET state = ? WHERE state = ?",
        (state.replace(b"alice", b"alicf"), state),
    )
    con.commit()
    con.close()
    verify = cli(home, "audit", "verify", ok=False)
    assert verify.returncode == 1, verify.stdout
    assert (
        f"position {at}: edited: a stored snapshot does not read (snapshot at position {at}: its "
        "payload digest differs): it was edited (a start skips it)"
    ) in verify.stdout, verify.stdout
