"""A what-if's failure is said in one line, never cut mid-word (atk47-29 F7)."""

from __future__ import annotations

from ledger.server.whatifs import one_line


def test_a_long_failure_is_cut_between_words_and_a_short_one_is_whole() -> None:
    words = " ".join(f"fairshare-{i}," for i in range(300))
    text = "ledger.server.whatifs exited with 2:\n" + words
    got = one_line(text, most=300)
    assert len(got) <= 302 and "\n" not in got and got.endswith(" …"), got
    assert got[:-2].split()[-1].startswith("fairshare-"), got  # a whole word last
    assert one_line("it failed:\n  a reason") == "it failed: a reason"
