"""A PostgreSQL DSN is known whatever its scheme's case, and its password never reaches an error
line (atk33-28 F8, F9)."""

from __future__ import annotations

import pytest

from ledger.cli.store import _place
from ledger.store.pgread import connect_params, is_postgres, redacted
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
