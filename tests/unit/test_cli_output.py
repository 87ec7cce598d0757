"""The CLI's output (`ledger.cli.output`): `print_table` writes a plain table on a pipe itself,
byte for byte what rich prints for the same table (`box=None`, the pipe's width) when it fits,
one line per row when it is wider; the log of every command that logs is ours at its level and
libraries' only when they warn."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from ledger.cli.output import PIPE_WIDTH, print_table, setup_logging

# printable ASCII as the fast path takes it (rich reads "[" as markup and ":x:" as an emoji
# name: cells with those are left out of the comparison, as the commands never print them)
CELL = st.text(alphabet=string.ascii_letters + string.digits + " -_./(),%#", max_size=24)


def _ours(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    out = io.StringIO()  # a pipe, not a terminal
    with contextlib.redirect_stdout(out):
        print_table(header, rows)
    return out.getvalue()


def _rich(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    out = io.StringIO()
    table = Table(*header, box=None)
    for row in rows:
        table.add_row(*row)
    Console(highlight=False, width=PIPE_WIDTH, file=out).print(table)
    return out.getvalue()


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 8).flatmap(
        lambda n: st.tuples(
            st.tuples(*[CELL.filter(lambda c: c.strip() != "") for _ in range(n)]),
            st.lists(st.tuples(*[CELL for _ in range(n)]), max_size=6),
        )
    )
)
def test_a_plain_table_is_what_rich_prints(
    table: tuple[tuple[str, ...], list[tuple[str, ...]]],
) -> None:
    header, rows = table
    assert _ours(header, rows) == _rich(header, rows)


@pytest.mark.parametrize(
    "header, rows",
    [
        (("job", "account"), []),  # a header alone
        (("Account", "Rank"), [("prog2", "-"), ("  proj0", "1"), ("    user_0", "12")]),
        (("node", "state"), [("n1", "drained (déjà vu)")]),  # not ASCII: rich measures it
    ],
)
def test_indents_wide_and_non_ascii_tables(
    header: tuple[str, ...], rows: list[tuple[str, ...]]
) -> None:
    assert _ours(header, rows) == _rich(header, rows)


def test_a_table_wider_than_a_pipe_keeps_one_line_per_row() -> None:
    """Where rich would wrap the wide cell onto several lines, a pipe gets whole rows."""
    header, rows = ("#", "reason"), [("1", "waiting: " + "x" * 190), ("22", "short")]
    lines = _ours(header, rows).splitlines()
    wide = len(rows[0][1])  # 199 columns: wider than the pipe with the first column
    assert lines == [" #   " + "reason".ljust(wide) + " ", " 1   " + rows[0][1] + " ",
                     " 22  " + "short".ljust(wide) + " "]  # fmt: skip
    assert len(_rich(header, rows).splitlines()) > len(lines)  # rich wraps it


def _log_lines(capsys: pytest.CaptureFixture[str], level: str, fmt: str = "text") -> list[str]:
    root = logging.getLogger()
    handlers, root_level = root.handlers[:], root.level
    setup_logging(level, fmt)
    try:
        logging.getLogger("gpuledger.test").info("ours at info")
        logging.getLogger("gpuledger.test").debug("ours at debug")
        logging.getLogger("uvicorn.error").info("a library at info")
        logging.getLogger("uvicorn.error").warning("a library warns")
    finally:
        root.handlers[:] = handlers
        root.setLevel(root_level)
    return capsys.readouterr().err.splitlines()


def test_the_log_is_ours_at_its_level_and_libraries_only_when_they_warn(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = _log_lines(capsys, "info")
    assert [line.split(" ", 2)[2] for line in lines] == [
        "INFO gpuledger.test ours at info",
        "WARNING uvicorn.error a library warns",
    ]
    assert len(_log_lines(capsys, "debug")) == 4
    assert [line.split(" ", 2)[2] for line in _log_lines(capsys, "warning")] == [
        "WARNING uvicorn.error a library warns"
    ]


def test_the_json_log_is_one_object_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    records = [json.loads(line) for line in _log_lines(capsys, "info", "json")]
    assert [(r["level"], r["logger"], r["msg"]) for r in records] == [
        ("info", "gpuledger.test", "ours at info"),
        ("warning", "uvicorn.error", "a library warns"),
    ]
    assert all(isinstance(r["ts"], float) for r in records)


def test_a_titled_table_and_a_table_written_to_a_file_are_what_rich_prints() -> None:
    header, rows = ("team", "owed GPU-h"), [("ai2/olmo", "1.0 -> 2.0"), ("ai2/tulu", "3.5")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_table(header, rows, title="actual -> what-if")
    want = io.StringIO()
    table = Table(*header, box=None, title="actual -> what-if")
    for row in rows:
        table.add_row(*row)
    Console(highlight=False, width=PIPE_WIDTH, file=want).print(table)
    assert out.getvalue() == want.getvalue()
    written = io.StringIO()
    print_table(header, rows, file=written)
    assert written.getvalue() == _rich(header, rows)


def test_a_whole_column_is_never_cut_on_a_narrow_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if's table at 80 columns: the team names stay whole (rows told apart) and no
    figure loses a digit to an ellipsis; the other columns fold."""
    from ledger.cli import output

    buf = io.StringIO()
    monkeypatch.setattr(output, "console", lambda **_: Console(file=buf, width=80))
    header = ("team", "owed GPU-h", "delivered GPU-h", "by period", "mean wait", "p90 wait",
              "never placed", "preemptions")  # fmt: skip
    rows = [
        (
            f"prog1/team0{i}",
            "19,353.6 -> 151.6",
            "0.0 -> 204.3",
            "0.0% -> 100.0%",
            "1h 2m -> 3m",
            "1h 2m -> 3m",
            "0 -> 3",
            "0 -> 2",
        )
        for i in (1, 3)
    ]
    print_table(header, rows, title="actual -> what-if", whole=(0,))
    text = buf.getvalue()
    assert "prog1/team01" in text and "prog1/team03" in text, text
    assert "…" not in text and max(len(ln) for ln in text.splitlines()) <= 80, text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_run_summary_too_wide_for_the_terminal_is_printed_as_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """atk47-29 F6: `simulate run`'s summary at 80 columns cut every figure to "100.…" (a row
    of 12 squeezed); past the terminal's width it is one record a run, a line a figure, whole.
    A table that fits is the table."""
    from ledger.cli import output
    from ledger.sim import report

    out = _Terminal()
    monkeypatch.setattr(output, "console", lambda **_: Console(file=out, width=80))
    header = [h for _, h in report.COLUMNS]
    row = ["fairshare-7", "100.0%", "100.0%", "88.7%", "15/15; 14/15", "100.0%; 99.1%",
           "52.6% / 91.2%", "3.1h", "0s/7m/2.2h",
           "0s", "2.7h", "5m / 2.9h", "0s (20)", "20 (2.2%; funded 0.0%)", "0.0%"]  # fmt: skip
    print_table(header, [row, row], records=True, file=out)
    lines = out.getvalue().splitlines()
    assert "…" not in out.getvalue() and max(len(ln) for ln in lines) <= 80, out.getvalue()
    assert lines[0].startswith("-[ 1 ]") and any(ln.startswith("-[ 2 ]") for ln in lines)
    for h, cell in zip(header, row, strict=True):  # every figure whole, under its name
        assert any(ln.startswith(h) and ln.endswith(cell) for ln in lines), (h, cell)
    narrow = _Terminal()
    monkeypatch.setattr(output, "console", lambda **_: Console(file=narrow, width=80))
    print_table(["policy", "owed"], [["fifo", "90.0%"]], records=True, file=narrow)
    assert "-[ 1 ]" not in narrow.getvalue() and "fifo" in narrow.getvalue()


PREEMPTIONS = ("at", "side", "job", "account", "user", "gpus", "reason", "victim rule", "for job",
               "for account", "lost GPU-h")  # fmt: skip
PREEMPTED = [
    ("2026-01-01 11:55:21Z", "suffered", "12345", "prog3/team06", "r054", "8", "debug",
     "debug lane: unfunded, 8 GPUs, loses 3.34 GPU-h", "12346", "prog1/team07", "3.3"),
    ("2026-01-02 09:00:00Z", "caused", "42", "prog2/team02", "r017", "8", "fairshare",
     "over share: prog2 at 140% of its share, newest first", "48", "prog1/team10", "11.3"),
]  # fmt: skip


@pytest.mark.parametrize("width", [80, 100, 160])
def test_names_and_dates_stay_whole_with_the_free_text_below_on_a_narrow_terminal(
    monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    """atk61-29b F5: `report preemptions` at 100 columns cut "prog1/t…" and "2026-01-…" and
    wrapped the rule over 6 lines (140 lines for 20 rows). Past the terminal's width the rule
    and reason go below each row (a record a row when even the rest does not fit); the table
    as it was when it fits."""
    from ledger.cli import output

    out = _Terminal()
    monkeypatch.setattr(output, "console", lambda **_: Console(file=out, width=width))
    print_table(PREEMPTIONS, PREEMPTED, free=(6, 7), file=out)
    text = out.getvalue()
    lines = text.splitlines()
    assert "…" not in text and max(len(ln) for ln in lines) <= width, text
    for row in PREEMPTED:  # every name, date and number whole on a line of its own row
        for cell in (row[0], row[3], row[9], row[2], row[10]):
            assert any(cell in ln for ln in lines), (cell, text)
    rows = [ln for ln in lines if ln.startswith(" 2026-")]
    if width >= 100:  # the table, each row's reason and rule whole below it (161 to fit)
        assert len(rows) == 2 and len(lines) <= 2 + 2 * 2, text
        assert all(f"victim rule: {r[7]}" in text.replace("\n       ", " ") for r in PREEMPTED)
    else:  # too narrow even without the rule: a record a row
        assert lines[0].startswith("-[ 1 ]"), text
    wide = _Terminal()
    monkeypatch.setattr(output, "console", lambda **_: Console(file=wide, width=170))
    print_table(PREEMPTIONS, PREEMPTED, free=(6, 7), file=wide)
    assert len(wide.getvalue().splitlines()) == 3, wide.getvalue()  # it fits: a line a row
