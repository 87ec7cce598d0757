"""The one error root. Every error says what was wrong and what to do; callers assert on fields."""

from __future__ import annotations


class LedgerError(Exception):
    """Root of every error the project raises on purpose.

    `code` is a stable machine-readable word; `message` says what was wrong; `hint` what to do.
    """

    code = "error"

    def __init__(self, message: str, *, hint: str = "", **fields: object) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.fields = fields

    def line(self) -> str:
        """One clear line for a terminal or an HTTP body."""
        return f"{self.message} ({self.hint})" if self.hint else self.message


class InvalidCommand(LedgerError):
    code = "invalid"


class TooLarge(InvalidCommand):
    """A request body over the API's limit (413)."""

    code = "too_large"


class UnknownEntity(LedgerError):
    code = "unknown"


class NotAuthorised(LedgerError):
    code = "forbidden"


class InvalidTransition(LedgerError):
    code = "transition"


class ContractViolation(LedgerError):
    code = "contract"


class EnvironmentProblem(LedgerError):
    """Not the command's fault: a directory that cannot be written, a store that cannot be read,
    a broker that cannot be reached. The message names the path or the address."""

    code = "environment"


class Conflict(LedgerError):
    """The log moved past the position a command expected, in a way that touches it."""

    code = "conflict"


class EventDecodeError(LedgerError):
    """Bytes in the log that are not a valid event of this version (corrupt, or a newer tag)."""

    code = "corrupt"

    def __init__(
        self,
        message: str,
        *,
        tag: str | None = None,
        known: bool = False,
        hint: str = "",
        **fields: object,
    ) -> None:
        super().__init__(message, hint=hint, **fields)
        self.fields.update(tag=tag, known=known)
        self.tag = tag
        self.known = known


class EngineError(LedgerError):
    """The execution engine (e.g. Slurm) cannot be reached or is set up in a way that would
    overrule the ledger's decisions."""

    code = "engine"


class EngineAway(EngineError):
    """The execution engine does not answer now (slurmctld is down): the service runs on,
    places nothing, says so in `status`, and opens the executor once the engine answers."""


class NotAuthenticated(LedgerError):
    """The caller could not be identified: no token, a malformed, unknown, expired or revoked
    one. Never says which, so a guesser learns nothing."""

    code = "unauthenticated"


class Unavailable(LedgerError):
    """The server cannot take the request now (it is stopping); retry elsewhere or later."""

    code = "unavailable"


class TooBusy(LedgerError):
    """The caller asks more than its share right now (queries at once, or a minute's worth):
    retry after `retry_after` seconds (HTTP 429 with Retry-After)."""

    code = "busy"


ERROR_CODES: dict[str, type[LedgerError]] = {
    cls.code: cls
    for cls in (
        LedgerError,
        InvalidCommand,
        TooLarge,
        UnknownEntity,
        NotAuthorised,
        InvalidTransition,
        ContractViolation,
        EnvironmentProblem,
        Conflict,
        EventDecodeError,
        NotAuthenticated,
        Unavailable,
        EngineError,
        TooBusy,
    )
}
"""Error classes by `code`: an HTTP client raises the same class the server raised (every code
of this module's: through a server the CLI printed `[error]` where embedded it printed
`[too_large]`, atk50-29 F7)."""
