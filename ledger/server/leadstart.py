"""A server's start on a PostgreSQL store, before it listens: the settings every server of the
store runs alike (`settings_of`), their check against the store's (`lease.agree`), and this
server's side of the lease (`_leadership`: refused in one line while another server reports at
its address). `ledger.server.run` composes it."""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import msgspec

from ledger.dispatch import registry
from ledger.server.ha import Leadership, resolved
from ledger.server.peers import address_key, others_at, same_address_words
from ledger.store import lease
from ledger.store.application import Ledger
from ledger.store.lease import Lease, NotCommitting, dead_here
from ledger.store.pgread import redacted
from ledger.wire.config import ServeConfig, admission_of, slurm_jobs_dir
from schemas import api
from schemas.errors import InvalidCommand

log = logging.getLogger("gpuledger.server")


def _leadership(
    ledger: Ledger, config: ServeConfig, policy: Any
) -> tuple[Leadership, dict[str, object] | None, set[tuple[int, int]]]:
    """This server's side of the lease on the ledger's PostgreSQL store (refused in one line
    when the store records another lease, node settings, executor, policy or admission and
    security settings: `lease.agree`), and the Slurm cluster it runs (None: not Slurm), which
    its executor checks again whenever slurmctld answers after being away (atk43ha F5), and
    the runs `--abandon-runs` leaves on the recorded cluster (`_runs_left`)."""
    assert ledger.dsn is not None
    slurm = None
    if config.executor == "slurm":  # which cluster: compared with the other servers' (F2)
        from ledger.engines.slurm.cluster import read_identity

        slurm = read_identity(os.environ)
    mine = settings_of(config, policy, slurm, slurm_jobs_dir(config, ledger.home))
    abandoned: set[tuple[int, int]] = set()
    vet = None if slurm is None else functools.partial(_runs_left, ledger, config, slurm, abandoned)
    uncommitted: list[str] = []  # the store commits nothing (its synchronous standby is away)
    since = lease.agree(ledger.dsn, mine, config.new_settings, vet, uncommitted)
    address = config.advertise
    if not address:
        scheme = "https" if config.tls_cert else "http"
        address = f"{scheme}://{config.listen}" if config.listen else f"unix:{ledger.home}"
    holder = f"{socket.gethostname()}:{os.getpid()}:{ledger.ids()[:8]}"
    since = since if config.new_settings else None
    if config.new_settings and since is None:
        log.warning("--new-settings: the store records this server's settings already; the "
                    "flag changes nothing (start it without the flag)")  # fmt: skip
    mine_lease = lease.Lease(ledger.dsn, holder, address, mine.lease_s, mine.node, mine.work, since,
                             admission=mine.admission)  # fmt: skip
    others, unretired = address_taken(mine_lease, ledger.position)
    uncommitted += [] if unretired is None else [unretired]
    if others:  # two servers at one URL (atk45ha L2)
        raise InvalidCommand(same_address_words(address, others),
                             hint="see docs/ha.md, 'One address per server'")  # fmt: skip
    log.info("store %s: leading once the lease is free (lease %gs)", redacted(ledger.dsn),
             config.lease.seconds)  # fmt: skip
    ha = Leadership(mine_lease)
    if uncommitted:  # said now: the start waits as a standby (atk49 F7)
        ha.uncommitted(uncommitted[0])
    return ha, slurm, abandoned


def _runs_left(
    ledger: Ledger,
    config: ServeConfig,
    slurm: dict[str, object],
    abandoned: set[tuple[int, int]],
    recorded: lease.Settings,
) -> None:
    """`--new-settings` onto another Slurm cluster than the `recorded` one: refused in one line
    while the ledger holds runs it does not list, unless `--abandon-runs` (then `abandoned`
    holds the runs recorded lost at the takeover): `cluster.vet_runs_left`."""
    from ledger.engines.slurm.cluster import vet_runs_left
    from ledger.engines.slurm.opening import ledger_id

    abandoned |= vet_runs_left(ledger.state, recorded.admission, slurm, config.partition,
                               lambda: ledger_id(ledger), config.abandon_runs)  # fmt: skip


def settings_of(
    config: ServeConfig,
    policy: Any,
    slurm: dict[str, object] | None = None,
    jobs_dir: Path | None = None,
) -> lease.Settings:
    """What every server on a store runs alike (`lease.Settings`): the lease, the node-lost
    timeout and fence, the executor and the policy, and what it admits and how it runs it
    (`admission_of`; `slurm`: which Slurm cluster it talks to; `jobs_dir`: with it, the run
    directory, `slurm_jobs_dir`, where the next leader reads the runs' marks). A standby takes
    the leader's work over as it was started, so a takeover with others changes them under
    running jobs (a server with `--executor none` took over a cluster's agents and their jobs
    were killed: atk33-28 F5)."""
    work = {
        "executor": config.executor,
        "words": _policy_words(registry.config_of(policy)),
        "policy": registry.config_of(policy),
    }
    return lease.Settings(
        config.lease.seconds,
        (config.node_lost_after.seconds, config.node_fence.seconds),
        msgspec.json.encode(work).decode(),
        admission_of(config, service_account(), slurm, jobs_dir),
    )


def service_account() -> tuple[int, str]:
    """The account this server runs as: (uid, name; "?" when the host names none)."""
    import pwd

    uid = os.geteuid()
    try:
        return uid, pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, "?"


def _policy_words(config: Any) -> str:
    return str(getattr(config, "version", type(config).__name__))


def address_taken(mine: Lease, position: int = 0) -> tuple[list[str], str | None]:
    """The live servers that report at `mine`'s address (`peers.others_at`): a predecessor of
    this host that is gone retires (`Lease.retire`; left out when the store commits nothing),
    and one elsewhere has `SILENT_S` to go silent (a restart on another host of a server killed
    there). This server is then registered (a standby at `position`): a store that commits
    nothing is found now, not after the service is open. Also why the store commits nothing
    (`NotCommitting`: the retire's or the registration's commit waited; the start said
    "internal error: NotCommitting", atk49 F7), if so."""
    uncommitted = None
    try:
        mine.retire(dead_here)
    except NotCommitting as err:
        uncommitted = err.message
    except Exception as err:  # a row that stays is left out below
        log.warning("could not retire this address's dead servers: %s", err)
    until = time.monotonic() + api.SILENT_S + 1.0
    key = functools.lru_cache(maxsize=None)(functools.partial(address_key, resolve=resolved))
    while others := others_at([m for m in mine.members() if not dead_here(m.holder)],
                              mine.address, mine.holder, api.SILENT_S, key):  # fmt: skip
        if time.monotonic() > until:
            return others, uncommitted
        time.sleep(1.0)
    if uncommitted is None:  # registered once the address is its own (a refused start's row
        try:  # would be another server at the running one's address)
            mine.report("standby", position)
        except NotCommitting as err:
            uncommitted = err.message
        except Exception as err:  # its first report says it (`Leadership._tick`)
            log.warning("could not register this server: %s", err)
    return [], uncommitted
