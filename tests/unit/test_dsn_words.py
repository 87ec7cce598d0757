"""A PostgreSQL DSN is known whatever its scheme's case, and its password never reaches an error
line (atk33-28 F8, F9)."""

from __future__ import annotations

import pytest

from ledger.cli.store import _place
from ledger.store.pgread import connect_error, connect_params, is_postgres, redacted
from schemas.errors import InvalidCommand


def test_an_uppercase_scheme_is_a_dsn_not_a_directory_and_says_no_password() -> None:
    dsn = "POSTGRESQL://u:Secr3t@h/db"
    assert is_postgres(dsn) and "Secr3t" not in redacted(dsn)
    assert _place(dsn)[1] == dsn  # `store copy SRC DST` made ./POSTGRESQL:/... before
    with pytest.raises(InvalidCommand) as err:
        connect_params(dsn)  # libpq reads only the lower-case schemes: one line, no password
    assert "Secr3t" not in err.value.line(), err.value.line()


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:Secr3t@h/db?bad=1",
        "host=h password=Secr3t bogus",
        "postgres://u:Secr3t@/x?y",
    ],
)
def test_libpqs_own_words_about_a_bad_dsn_lose_its_password(dsn: str) -> None:
    with pytest.raises(InvalidCommand) as err:
        connect_params(dsn)
    assert "Secr3t" not in err.value.line(), err.value.line()


@pytest.mark.parametrize(
    "dsn",
    [
        "host=127.0.0.1 dbname=g user=g password = Secr3t",  # spaces around `=`, as libpq takes
        "host=h password='Secr3t zz'",  # a quoted value with a space: both words hidden
        "postgresql://g@h:1/g?pass%77ord=Secr3t",  # a percent-encoded key libpq decodes
        "postgresql:///db?host=/tmp&password=Secr3t",
        "host=h password='Secr3t unterminated",  # libpq cannot parse it: keys only
        # the client key's pass phrase (atk49 F5: shown in errors and the server's log)
        "postgresql://u:S1@h:1/g?sslpassword=Secr3t&target_session_attrs=read-write",
        "postgresql://u@h/g?ssl%70assword=Secr3t",
        "host=127.0.0.1 user=u password=S2 sslpassword=Secr3t sslmode=require",
    ],
)
def test_every_spelling_libpq_takes_of_a_password_is_hidden(dsn: str) -> None:
    """atk48-ha F1: the server's log and errors showed the password written these ways."""
    shown = redacted(dsn)
    assert "Secr3t" not in shown and "zz" not in shown, shown


def test_a_dsn_without_a_password_is_shown_whole() -> None:
    assert redacted("postgresql:///db?host=/tmp") == "postgresql:///db?host=/tmp"
    assert set(redacted("host=h dbname=x").split()) == {"host=h", "dbname=x"}


def test_a_multi_host_connection_error_names_every_host_s_cause_the_first_host_first() -> None:
    """psycopg's first line is the last host's alone: a primary's timeout was said as its
    standby's "session is read-only" (atk50b-ha F4)."""
    said = (
        'connection failed: connection to server at "10.0.0.2", port 5433 failed: session is '
        "read-only\nMultiple connection attempts failed. All failures were:\n"
        "- host: '10.0.0.1', port: '5432', hostaddr: '10.0.0.1': connection timeout expired\n"
        "- host: '10.0.0.2', port: '5433', hostaddr: '10.0.0.2': connection failed: connection "
        'to server at "10.0.0.2", port 5433 failed: session is read-only'
    )
    assert connect_error(said) == (
        "each host failed: 10.0.0.1:5432: connection timeout expired; "
        "10.0.0.2:5433: session is read-only"
    )
    one = 'connection failed: connection to server at "h", port 1 failed: refused\n\tIs it up?'
    assert (
        connect_error(one)
        == 'connection failed: connection to server at "h", port 1 failed: refused'
    )
