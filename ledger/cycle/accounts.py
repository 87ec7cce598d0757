"""The OS account database as the run-as rule reads it (`ledger.core.runas`). An edge: pwd.

The server asks it at a submission and when a member is added, the dispatcher when it hands a
job to an engine: one lookup each, by name, in the password database of the host the service
runs on (a cluster's nodes share it: LDAP, SSSD, or the same /etc/passwd).
"""

from __future__ import annotations

import grp
import os
import pwd

from ledger.core.runas import OsAccount


def os_account(name: str) -> OsAccount | None:
    """The OS account named `name`, or None when the host has none."""
    try:
        pw = pwd.getpwnam(name)
    except (KeyError, ValueError):  # ValueError: a name with a NUL byte
        return None
    groups: list[str] = []
    try:
        gids = os.getgrouplist(pw.pw_name, pw.pw_gid)
    except OSError:
        gids = [pw.pw_gid]
    for gid in gids:
        try:
            groups.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return OsAccount(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir, pw.pw_shell, tuple(groups))
