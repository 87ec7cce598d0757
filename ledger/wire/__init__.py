"""What the agent and the CLI share to talk to a server: the HTTP client and the config files.

`SOCKET_NAME` lives here, not in a module, so a command that only asks whether a server runs on
its home (every CLI start) loads neither."""

SOCKET_NAME = "gpuledger.sock"
"""The Unix socket a server listens on in its data directory (unless `socket` says otherwise):
where the CLI and the jobs on the server's host find it (`ledger.wire.client.local_socket`)."""
