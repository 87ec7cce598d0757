"""A relay stopped on a topic ahead of the store names a signing key only when it signs (atk61-ha
F6: with no keys anywhere, it said "it has position 413 signed with our key" of records that
carried no signature)."""

from __future__ import annotations

from types import SimpleNamespace

from ledger.store.relay_bookmark import refusal


def test_a_topic_ahead_of_the_store_names_our_key_only_when_we_sign() -> None:
    unsigned = SimpleNamespace(topic="t", keys=None, store_head=lambda: 400)
    err = refusal(unsigned, 413, 400)  # type: ignore[arg-type]
    assert (
        err.message == "topic t is ahead of the store: it has position 413, the store ends at 400"
    )
    assert "key" not in (err.hint or "")
    signed = SimpleNamespace(topic="t", keys=object(), store_head=lambda: 400)
    err = refusal(signed, 413, 400)  # type: ignore[arg-type]
    assert err.message == (
        "topic t is ahead of the store: it has position 413 signed with our key, the store "
        "ends at 400"
    )
