"""What the agent and the CLI share to talk to a server: the HTTP client and the config files.

`SOCKET_NAME` lives here, not in a module, so a command that only asks whether a server runs on
its home (every CLI start) loads neither."""

SOCKET_NAME = "gpuledger.sock"
"""The Unix socket a server listens on in its data directory (unless `socket` says otherwise):
where the CLI and the jobs on the server's host find it (`ledger.wire.client.local_socket`)."""

OUTCOME_HEADER = "X-Gpuledger-Outcome"
"""`unknown` on a 503 whose write may be stored all the same: its commit ran on the primary and
waited for, or was cancelled before, the synchronous standby's confirmation; a stop answered it
while it waited on the store (`ledger.wire.client._in_doubt`)."""
