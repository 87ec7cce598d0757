"""Ctrl-C stops a command with exit 130 and no error line (README), also when what it ran
turned the interrupt into its own error: DuckDB makes a Ctrl-C during a query "Query
interrupted" (or a transaction then aborted), and `projection rebuild` ended "internal error
... report it", exit 70 (atk47-29 F9)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from ledger.cli import output
from ledger.cli.output import EXIT_BUG, EXIT_INTERRUPTED, LedgerGroup


@pytest.fixture
def sigint() -> Iterator[None]:
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        output._SIGINT_SEEN[0] = False


def group(interrupted: bool) -> click.Group:
    @click.group(cls=LedgerGroup)
    def cli() -> None:
        pass

    @cli.command()
    def rebuild() -> None:
        try:
            if interrupted:
                os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, mid-query
            time.sleep(0.5)
        except KeyboardInterrupt:
            pass  # as DuckDB: the query stops and says so in its own words
        raise RuntimeError("Query interrupted")

    return cli


def test_an_error_after_a_ctrl_c_is_the_stop_asked_for(sigint: None) -> None:
    out = CliRunner().invoke(group(True), ["rebuild"])
    assert out.exit_code == EXIT_INTERRUPTED and "internal error" not in out.output, out.output


def test_the_same_error_without_a_ctrl_c_is_still_a_bug(sigint: None) -> None:
    out = CliRunner().invoke(group(False), ["rebuild"])
    assert out.exit_code == EXIT_BUG and "internal error" in out.output, out.output
