"""The CLI's side of the API: a small HTTP client over TCP (http/https) or a Unix socket.

Errors come back as problem details with the LedgerError code; the client raises the same
class with the same message and hint, so the CLI prints the same line as in embedded mode.
Standard library only (http.client), so a client command starts fast.
"""

from __future__ import annotations

import http.client
import os
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import msgspec

from ledger.wire import SOCKET_NAME
from schemas import api
from schemas.commands import AnyCommand
from schemas.errors import ERROR_CODES, InvalidCommand, LedgerError, Unavailable

if TYPE_CHECKING:
    from ledger.store.application import Appended

TIMEOUT_S = 60.0


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def token_file() -> Path:
    """Where `token create --save` keeps the caller's token: a 0600 file in their config dir."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuledger" / "token"


def load_token() -> str | None:
    """$GPULEDGER_TOKEN, else a job's own $GPULEDGER_JOB_TOKEN (set inside jobs that node agents
    run), else the token file (refused unless only its owner can read it)."""
    env = os.environ.get("GPULEDGER_TOKEN") or os.environ.get("GPULEDGER_JOB_TOKEN")
    if env:
        return env.strip()
    path = token_file()
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidCommand(
            f"{path} is readable by others", hint=f"run `chmod 600 {path}` (it holds a secret)"
        )
    return path.read_text().strip() or None


class Client:
    """Talks to one server: `http(s)://HOST:PORT` or `unix:/PATH`."""

    def __init__(self, url: str, token: str | None = None, timeout: float = TIMEOUT_S) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        if url.startswith("unix:"):
            self._unix: str | None = url[len("unix:") :]
            return
        self._unix = None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidCommand(
                f"invalid server URL {url!r}", hint="use http(s)://HOST:PORT or unix:/PATH"
            )
        self._parts = parts

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._unix is not None:
                self._conn = _UnixConnection(self._unix, self.timeout)
            elif self._parts.scheme == "https":
                import ssl  # only for https: a plain or Unix-socket client starts faster

                ctx = ssl.create_default_context(cafile=os.environ.get("GPULEDGER_CA_FILE"))
                self._conn = http.client.HTTPSConnection(
                    self._parts.hostname or "", self._parts.port or 443, timeout=self.timeout,
                    context=ctx,
                )  # fmt: skip
            else:
                self._conn = http.client.HTTPConnection(
                    self._parts.hostname or "", self._parts.port or 80, timeout=self.timeout
                )
        return self._conn

    def request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.token:  # on the Unix socket too: a token given is the caller (a job's own)
            headers["Authorization"] = f"Bearer {self.token}"
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (ConnectionError, http.client.HTTPException, OSError) as err:
                conn.close()
                self._conn = None
                if attempt == 0 and isinstance(err, http.client.RemoteDisconnected):
                    continue  # a kept-alive connection the server closed: once more
                raise Unavailable(
                    f"cannot reach the server at {self.url}: {err}",
                    hint="is `gpuledger serve` running? check GPULEDGER_URL",
                ) from err
        if resp.status >= 400:
            raise _error(resp.status, data)
        return data

    def execute(self, cmd: AnyCommand) -> Appended:
        from ledger.core.decide import _bounded
        from ledger.store.application import Appended

        _bounded(cmd)  # out of bounds: the same line as embedded mode, before any request

        tag = type(cmd).__struct_config__.tag
        data = self.request("POST", f"/v1/commands/{tag}", msgspec.json.encode(cmd))
        result = msgspec.json.decode(data, type=api.CommandResult)
        return Appended(events=list(result.events), position=result.position)

    def execute_all(self, cmds: list[AnyCommand]) -> Appended:
        from ledger.core.decide import _bounded
        from ledger.store.application import Appended

        for cmd in cmds:
            _bounded(cmd)

        data = self.request("POST", "/v1/batch", msgspec.json.encode(api.Batch(commands=cmds)))
        result = msgspec.json.decode(data, type=api.CommandResult)
        return Appended(events=list(result.events), position=result.position)

    def get(self, path: str, query: dict[str, Any] | None = None, type: Any = Any) -> Any:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        # a list is the parameter repeated (?job_ids=1&job_ids=7), as the server reads it
        data = self.request("GET", f"/v1/{path}" + (f"?{urlencode(q, doseq=True)}" if q else ""))
        return msgspec.json.decode(data, type=type)

    def post(self, path: str, body: Any, type: Any = Any) -> Any:
        """POST a request Struct to /v1/`path` and decode the answer as `type`."""
        data = self.request("POST", f"/v1/{path}", msgspec.json.encode(body))
        return msgspec.json.decode(data, type=type)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _error(status: int, data: bytes) -> LedgerError:
    try:
        p = msgspec.json.decode(data, type=api.Problem)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return LedgerError(f"the server answered {status}: {data[:200]!r}")
    cls = ERROR_CODES.get(p.code, LedgerError)
    if p.message:
        return cls(p.message, hint=p.hint)
    return cls(p.detail)


def local_socket(home: Path) -> Path | None:
    """The Unix socket of a server running on `home`, if one answers there."""
    path = home / SOCKET_NAME
    if not path.exists():
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return None  # stale: the server is gone
    finally:
        probe.close()
    return path
