"""The chain's rules, pure: a v2 link covers every column of a stored row, a v1 link the payload
only; a reader's tip accepts the next record by the rule its link is written in, and never a v1
link once the log moved to v2."""

from __future__ import annotations

import hashlib

import pytest

from projections.chain import START, Tip, link, link_v1, names, rule

DATA = b'{"type":"node.registered.v1","prev_hash":"","node":"n1"}'
TAG = "node.registered.v1"


def test_a_v2_link_covers_the_position_version_tag_and_payload() -> None:
    base = link(7, TAG, DATA, 7)
    assert rule(base) == 2 and base.startswith("v2:")
    assert link(7, TAG, DATA) == base  # the version defaults to the position
    others = {
        "position": link(8, TAG, DATA, 7),
        "version": link(7, TAG, DATA, 8),
        "tag": link(7, "node.removed.v1", DATA, 7),
        "payload": link(7, TAG, DATA + b" ", 7),
        "tag and payload shifted": link(7, TAG + "{", DATA[1:], 7),
    }
    for what, other in others.items():
        assert other != base, what


def test_a_v1_link_is_the_payloads_sha256() -> None:
    assert link_v1(DATA) == hashlib.sha256(DATA).hexdigest()
    assert rule(link_v1(DATA)) == 1
    assert rule("v2:xyz") is None and rule("") is None and rule("0" * 65) is None


@pytest.mark.parametrize("kind", [1, 2])
def test_a_stored_link_names_its_record_under_its_own_rule(kind: int) -> None:
    kept = link(7, TAG, DATA) if kind == 2 else link_v1(DATA)
    assert names(kept, 7, TAG, DATA)
    assert not names(kept, 7, TAG, DATA + b" ")
    assert names(kept, 8, "other", DATA) == (kind == 1)  # v1 never covered position or tag


def record(prev: str) -> bytes:
    return b'{"type":"x.v1","prev_hash":"' + prev.encode() + b'"}'


def test_a_tip_takes_the_next_record_under_the_rule_its_link_is_written_in() -> None:
    first = record("")
    assert START.problem(first) is None
    tip = START.after(1, "x.v1", first)
    assert tip.problem(record(link_v1(first))) is None
    assert tip.problem(record(link(1, "x.v1", first))) is None
    assert tip.problem(record(link(2, "x.v1", first))) is not None  # relabelled
    assert tip.problem(b"not json") == "no readable prev_hash in the value"


def test_once_a_v2_link_is_met_a_v1_link_is_refused() -> None:
    first = record("")
    second = record(link(1, "x.v1", first))
    tip = START.after(1, "x.v1", first).after(2, "x.v1", second)
    assert tip.upgraded
    problem = tip.problem(record(link_v1(second)))
    assert problem is not None and "after the log moved to v2" in problem


def test_a_tip_is_named_by_either_of_its_links() -> None:
    tip = Tip.of(3, TAG, DATA)
    assert tip.named_by(link(3, TAG, DATA)) and tip.named_by(link_v1(DATA))
    assert not tip.named_by(link(4, TAG, DATA)) and not START.named_by("")
