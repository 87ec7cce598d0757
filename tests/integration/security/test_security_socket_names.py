"""Who a caller on the Unix socket is when serve.toml maps ledger users to other OS accounts
(atk46-23 F4; `ledger.server.identity.socket_user`): a real server with `os_accounts`, real OS
accounts (`userkit`) calling the socket from their own processes (Debian's /usr/bin/python3:
the project's venv is not theirs to read), the kernel's SO_PEERCRED naming them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.integration.serverkit import cli, start_server
from tests.integration.userkit import User, os_user, shared_dir

ASK = r"""
import socket, sys
path, method, route, body = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
s.sendall(f"{method} {route} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
          f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
got = b""
while chunk := s.recv(65536):
    got += chunk
head, _, rest = got.partition(b"\r\n\r\n")
print(head.split()[1].decode())
print(rest.decode())
"""


def ask_as(who: User, sock: Path, method: str, route: str, body: str = "") -> tuple[int, str]:
    """`method route` on the server's Unix socket from a process of `who`'s: status, body."""
    done = subprocess.run(
        ["/usr/bin/python3", "-c", ASK, str(sock), method, route, body],
        user=who.uid, group=who.gid, extra_groups=[], capture_output=True, text=True,
        timeout=30, cwd="/", check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    status, _, text = done.stdout.partition("\n")
    return int(status), text


def test_the_socket_reads_os_accounts_backwards_and_never_makes_an_os_user_a_mapped_namesake() -> (
    None
):
    """As reported: `os_accounts = { L = "O" }` (ledger user L's jobs run as OS account O).
    The socket took the caller's OS name as the actor: OS user L (another person, whose name
    is L's ledger name) was ledger user L and submitted jobs that ran as O; O's owner was
    ledger user O, not L. Now O is L on the socket; OS user L is refused in one line (a submit
    too: nothing appended); an unmapped account is itself."""
    with (
        os_user("glnl") as namesake,
        os_user("glno") as owner,
        os_user("glnp") as plain,
        shared_dir("gpuledger-names-") as top,
    ):
        home = top / "ledger"
        cli(home, "init", "--admin", "root")
        budget = top / "budget.toml"
        budget.write_text(
            '[accounts."ai2"]\nkind = "program"\n[accounts."ai2/olmo"]\nkind = "project"\n'
            f'members = ["{namesake.name}", "{plain.name}"]\n'
        )
        cli(home, "budget", "apply", str(budget), GPULEDGER_USER="root")
        home.chmod(0o755)  # other accounts reach the socket
        conf = top / "serve.toml"
        conf.write_text(f'[os_accounts]\n{namesake.name} = "{owner.name}"\n')
        server = start_server(home, "--config", str(conf))
        try:
            sock = home / "gpuledger.sock"
            status, text = ask_as(owner, sock, "GET", "/v1/whoami")
            assert status == 200 and json.loads(text)["actor"] == namesake.name, text
            status, text = ask_as(plain, sock, "GET", "/v1/whoami")
            assert status == 200 and json.loads(text)["actor"] == plain.name, text
            status, text = ask_as(namesake, sock, "GET", "/v1/whoami")
            said = (f"OS account '{namesake.name}' is not the ledger user '{namesake.name}': "
                    f"serve.toml's os_accounts runs that user's jobs as OS account "
                    f"'{owner.name}'")  # fmt: skip
            assert status == 401 and said in text, (status, text)
            submit = json.dumps({"account": "ai2/olmo", "gpus": 1})
            status, text = ask_as(namesake, sock, "POST", "/v1/commands/submit", submit)
            assert status == 401 and said in text, (status, text)
            jobs = cli(home, "jobs", "--json", GPULEDGER_USER="root").stdout
            assert json.loads(jobs) == [], jobs  # nothing appended
        finally:
            assert server.stop() == 0
