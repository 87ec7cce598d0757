"""The ledger server: one authenticated HTTP API (Litestar under uvicorn) in front of the service
loop, over TCP (bearer tokens, optional TLS) and a Unix socket (the caller's OS user via
SO_PEERCRED)."""
