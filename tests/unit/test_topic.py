"""One name for the topic: the relay, every reader and every CLI `--topic` follow
`$GPULEDGER_KAFKA_TOPIC` alike (an audit once checked the default topic while the relay wrote
the one the variable named)."""

from __future__ import annotations

import click
import pytest

from projections import kafka_wire


def test_the_variable_names_the_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kafka_wire.TOPIC_ENV, raising=False)
    assert kafka_wire.topic() == kafka_wire.TOPIC == "gpuledger.events"
    monkeypatch.setenv(kafka_wire.TOPIC_ENV, "site.events")
    assert kafka_wire.topic() == "site.events"


def _options(cmd: click.Command, path: str = "") -> list[tuple[str, click.Parameter]]:
    out = [(f"{path} {cmd.name}", p) for p in cmd.params]
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(click.Context(cmd)):
            sub = cmd.get_command(click.Context(cmd), name)
            if sub is not None:
                out += _options(sub, f"{path} {cmd.name}")
    return out


def test_every_topic_option_reads_the_variable() -> None:
    from ledger.cli import cli

    topics = [(where, p) for where, p in _options(cli) if p.name == "topic"]
    assert len(topics) >= 2, topics  # project follow, audit verify
    assert all(getattr(p, "envvar", None) == kafka_wire.TOPIC_ENV for _, p in topics), topics
