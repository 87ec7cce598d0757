"""The API's query strings, strictly: the gate every GET route's parameters pass before the
framework reads them (docs/security.md, row T14; docs/server.md, "Request bodies").

A request body is decoded strictly in `ledger.server.commands`; a query string is held to the
same rule here, on every GET (and HEAD) route of the app (found in its handlers' signatures, so a
new route cannot be forgotten):

- the whole query at most `MAX_QUERY` bytes, at most `MAX_PARAMS` parameters, each value at most
  `MAX_VALUE` characters; valid UTF-8 after percent-decoding; no NUL (nor any other control
  character) in a name or a value; every parameter `name=value`;
- only the names the route declares (an unknown one is refused, naming those it knows);
- a name given once, unless the route takes a list of it (`job_ids=1&job_ids=2`);
- each value in its type's own text and nothing looser: an integer is decimal digits (not
  `5.0`, `1e3` or `0x10`, nor with a leading zero: `05`), a number is a finite decimal (not
  `nan` or `inf`, nor `05.5`), a boolean is exactly `true` or `false`, and the bounds the route
  declares hold (`wait` of the agents' poll included);
- an integer path parameter (`/ui/api/job/{id}`, `/ui/api/decision/{position}`) is within 0 and
  2^62.

A query that fails is one problem+json line, 400 `invalid`, naming the parameter; an
unidentified caller of a route that needs an identity gets 401 first, as with bodies. The
dashboard's page shells (`/ui/<page>`) keep their query for the browser's script: only the
first rule applies to them, but for the length of one value (their script drops a value the API
refuses, and says so).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import unquote_plus

import msgspec

from schemas.errors import InvalidCommand

MAX_QUERY = 16 * 1024
"""The longest query string (bytes, as sent)."""
MAX_PARAMS = 64
MAX_VALUE = 1024
"""The longest value of one parameter (characters, decoded): user and account names, epochs,
positions and words are far shorter; a list (`job_ids`) is one parameter per item."""

_RESERVED = frozenset(
    {"request", "state", "scope", "headers", "cookies", "socket", "query", "data", "body"}
)
"""Handler parameters the framework fills from elsewhere than the query string."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,18})")
_FLOAT = re.compile(
    r"-?(?:(?:0|[1-9][0-9]{0,19})(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(?:[eE][-+]?[0-9]{1,3})?"
)
_BOOL = frozenset({"true", "false"})
MAX_PATH_INT = 2**62
"""The largest integer a path parameter may hold (a job id, a log position)."""
_PATH_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


@dataclass(frozen=True)
class Param:
    """One query parameter a route declares."""

    name: str
    text: str
    """The text its values must be: "int", "float", "bool", or "str" (anything msgspec then
    checks against the type: words of a Literal, strings with their bounds)."""
    many: bool
    """A list: the name may repeat, one item each time."""


@dataclass(frozen=True)
class Schema:
    """What a route's query may hold."""

    params: dict[str, Param]
    struct: type[msgspec.Struct] | None
    """The parameters as a Struct (forbidding unknown fields), to check types and bounds."""
    free: bool = False
    """A page shell: its query is the browser's; only the size and character rules apply."""
    needs_caller: bool = True


def schema_of(handler: Any, *, free: bool = False) -> Schema:
    """The query a Litestar route handler declares (its signature, as the framework reads it)."""
    path_names = {m for p in getattr(handler, "paths", ()) for m in _PATH_PARAM.findall(p)}
    needs_caller = bool(getattr(handler, "security", None)) or any(
        p.startswith(("/ui/api", "/metrics")) for p in getattr(handler, "paths", ())
    )
    if free:
        return Schema({}, None, free=True, needs_caller=needs_caller)
    params: dict[str, Param] = {}
    fields: list[tuple[str, Any, Any]] = []
    for name, fd in handler.parsed_fn_signature.parameters.items():
        if name in _RESERVED or name in path_names:
            continue
        kwarg = fd.kwarg_definition
        if kwarg is not None and type(kwarg).__name__ == "DependencyKwarg":
            continue
        if getattr(kwarg, "header", None) or getattr(kwarg, "cookie", None):
            continue
        alias = getattr(kwarg, "query", None) or getattr(kwarg, "name", None) or name
        kind = _bounded(fd.annotation, kwarg)
        text, many = _text_of(kind)
        params[alias] = Param(alias, text, many)
        default = fd.default if fd.has_default else msgspec.NODEFAULT
        fields.append((alias, kind, None if default is msgspec.NODEFAULT else default))
    struct = (
        msgspec.defstruct(
            "Query", [(n, k | None, None) for n, k, _ in fields], forbid_unknown_fields=True
        )
        if fields
        else None
    )
    return Schema(params, struct, needs_caller=needs_caller)


def _bounded(kind: Any, kwarg: Any) -> Any:
    """`kind` with the bounds the framework's parameter declares (ge, le, ...) as msgspec's."""
    bounds = {
        k: getattr(kwarg, k)
        for k in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern")
        if isinstance(getattr(kwarg, k, None), int | float | str)
    }
    return Annotated[kind, msgspec.Meta(**bounds)] if bounds else kind


def _scalars(kind: Any) -> tuple[set[Any], bool]:
    """The scalar types a parameter's type accepts, and whether it is a list of them."""
    origin = typing.get_origin(kind)
    if origin is Annotated:
        return _scalars(typing.get_args(kind)[0])
    if origin in (typing.Union, types.UnionType):
        out: set[Any] = set()
        many = False
        for arg in typing.get_args(kind):
            got, m = _scalars(arg)
            out |= got
            many = many or m
        return out, many
    if origin is Literal:
        return {type(x) for x in typing.get_args(kind)}, False
    if origin in (tuple, list, set, frozenset):
        inner: set[Any] = set()
        for arg in typing.get_args(kind):
            if arg is not Ellipsis:
                inner |= _scalars(arg)[0]
        return inner, True
    return {kind}, False


def _text_of(kind: Any) -> tuple[str, bool]:
    scalars, many = _scalars(kind)
    scalars.discard(type(None))
    if str in scalars or not scalars:
        return "str", many
    if scalars == {bool}:
        return "bool", many
    if scalars <= {int}:
        return "int", many
    if scalars <= {int, float}:
        return "float", many
    return "str", many


def _form_ok(text: str, value: str) -> bool:
    if text == "int":
        return _INT.fullmatch(value) is not None
    if text == "float":
        return _FLOAT.fullmatch(value) is not None
    if text == "bool":
        return value in _BOOL
    return True


def parse(raw: bytes, free: bool = False) -> list[tuple[str, str]]:
    """Pure: the query string's pairs in order, or InvalidCommand for one that breaks the size
    or character rules (see the module docstring), naming the parameter (`param`: the
    dashboard drops a value of its address the API refuses, and says so). A page shell's query
    (`free`) is the browser's: a value over `MAX_VALUE` goes to the page's script, which drops
    it when the API refuses it; the page route refused it, raw JSON in place of the page
    (atk61-29c F4)."""
    if len(raw) > MAX_QUERY:
        raise InvalidCommand(
            f"the query string is {len(raw):,} bytes, over the limit of {MAX_QUERY:,}",
            hint="ask with fewer or shorter parameters",
        )
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as err:
        raise InvalidCommand(
            "the query string holds bytes that are not percent-encoded",
            hint="percent-encode every byte outside ASCII (UTF-8)",
        ) from err
    pairs = []
    for part in text.split("&"):
        if not part:
            continue
        if "=" not in part:
            raise InvalidCommand(
                f"query parameter {_shown(part)} has no value", hint="give each as name=value"
            )
        name, _, value = part.partition("=")
        try:
            name, value = unquote_plus(name, errors="strict"), unquote_plus(value, errors="strict")
        except UnicodeDecodeError as err:
            raise InvalidCommand(
                f"query parameter {_shown(name)} is not valid UTF-8 once percent-decoded",
                hint="percent-encode text as UTF-8",
            ) from err
        if _CONTROL.search(name) or _CONTROL.search(value):
            raise InvalidCommand(
                f"query parameter {_shown(name)} holds a NUL or another control character",
                hint="control characters are refused in every name and value",
            )
        if len(value) > MAX_VALUE and not free:
            raise InvalidCommand(
                f"query parameter {_shown(name)} is {len(value):,} characters long, over the "
                f"limit of {MAX_VALUE:,}",
                hint="no parameter needs that much",
                param=name[:80],
            )
        pairs.append((name, value))
        if len(pairs) > MAX_PARAMS:
            raise InvalidCommand(
                f"the query string has more than {MAX_PARAMS} parameters",
                hint="ask with fewer parameters",
            )
    return pairs


def check(schema: Schema, pairs: list[tuple[str, str]], where: str) -> None:
    """Pure: InvalidCommand (one line) unless `pairs` are what `schema` declares."""
    if schema.free:
        return
    given: dict[str, Any] = {}
    for name, value in pairs:
        param = schema.params.get(name)
        if param is None:
            known = ", ".join(sorted(schema.params)) or "none"
            raise InvalidCommand(
                f"{where} takes no query parameter {_shown(name)} (it takes: {known})",
                hint="see /v1/openapi.json",
            )
        if not _form_ok(param.text, value):
            article = "an" if param.text == "int" else "a"
            word = {"int": "integer", "float": "finite number", "bool": "boolean"}[param.text]
            spelled = {"int": "decimal digits without a leading zero",
                       "float": "a decimal such as 1.5",
                       "bool": "true or false"}[param.text]  # fmt: skip
            raise InvalidCommand(
                f"query parameter {name!r} of {where} is not {article} {word}: {_shown(value)}",
                hint=f"give {spelled}",
                param=name,
            )
        if param.many:
            given.setdefault(name, []).append(value)
        elif name in given:
            raise InvalidCommand(
                f"query parameter {name!r} of {where} is given more than once",
                hint="give it once",
                param=name,
            )
        else:
            given[name] = value
    if schema.struct is not None and given:
        try:
            msgspec.convert(given, schema.struct, strict=False)
        except msgspec.ValidationError as err:
            # the parameter refused named (`param`: the dashboard drops it, atk61-29a F3)
            at = re.search(r"`\$\.(\w+)", str(err))
            raise InvalidCommand(
                f"invalid query of {where}: {_query_words(str(err))}",
                hint="see /v1/openapi.json",
                param=at.group(1) if at else "",
            ) from err


def _query_words(err: str) -> str:
    """msgspec's line with the parameter named as in the URL (`$.limit` -> `limit`)."""
    return re.sub(r"`\$\.(\w+)(\[\d+\])?`", r"`\1`", err)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


class QueryGate:
    """The app's `before_request` hook: every GET's query checked against its route's schema
    (built once per route handler). `identify(request)` raises for a caller the route refuses,
    so that an unidentified caller is told 401 before anything about its query."""

    def __init__(self, identify: Callable[[Any], Any], free: Callable[[Any], bool]) -> None:
        self.identify = identify
        self.free = free
        self._schemas: dict[int, Schema] = {}

    def schema(self, handler: Any) -> Schema:
        got = self._schemas.get(id(handler))
        if got is None:
            got = self._schemas[id(handler)] = schema_of(handler, free=self.free(handler))
        return got

    async def __call__(self, request: Any) -> None:
        for name, value in request.path_params.items():
            if isinstance(value, int) and not 0 <= value <= MAX_PATH_INT:
                if self.schema(request.scope["route_handler"]).needs_caller:
                    self.identify(request)
                raise InvalidCommand(
                    f"path parameter {name!r} of {request.method} "
                    f"{request.scope.get('path', '')[:80]} is out of range",
                    hint=f"give a whole number from 0 to {MAX_PATH_INT:,}",
                )
        if request.method not in ("GET", "HEAD"):
            return
        raw: bytes = request.scope.get("query_string", b"")
        schema = self.schema(request.scope["route_handler"])
        if not raw and not schema.free:
            return
        try:
            check(schema, parse(raw, schema.free), f"GET {request.scope.get('path', '')}")
        except InvalidCommand:
            if schema.needs_caller:
                self.identify(request)
            raise
