"""What is not UTF-8 on any command's line is one `[invalid]` line (`ledger.cli.output.
utf8_refusal`), as `submit` says it of its own (s46-utf8): a Latin-1 byte in `--url`'s host or
`jobs -u` was an `[internal]` error, and `--as` went on to read as a user no one is."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.cli import cli

BAD = "caf\udce9"  # the bytes `caf\xe9`, as Python hands them over


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as done:
        cli.main(list(args), prog_name="gpuledger")
    return int(done.value.code or 0), capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    ("args", "env", "want"),
    [
        (("--as", BAD, "jobs"), {}, r"--as (or $GPULEDGER_USER) is not valid UTF-8: 'caf\xe9'"),
        ((f"--as={BAD}", "queue"), {}, r"--as (or $GPULEDGER_USER) is not valid UTF-8"),
        (("jobs",), {"GPULEDGER_USER": BAD}, "--as (or $GPULEDGER_USER) is not valid UTF-8"),
        (("--url", f"http://{BAD}:1", "jobs"), {}, r"--url (or $GPULEDGER_URL) is not valid"),
        (("--url", f"unix:/tmp/{BAD}", "status"), {}, "--url (or $GPULEDGER_URL) is not valid"),
        (("--home", f"/tmp/{BAD}", "jobs"), {}, r"--home (or $GPULEDGER_HOME) is not valid"),
        (("jobs", "-u", BAD), {}, r"argument 2 of `jobs` is not valid UTF-8: 'caf\xe9'"),
        (("jobs", "-A", BAD), {}, "argument 2 of `jobs` is not valid UTF-8"),
        (("cancel", "1", BAD), {}, "argument 2 of `cancel` is not valid UTF-8"),
        (("token", "create", "--user", BAD), {}, "argument 3 of `token` is not valid UTF-8"),
        (("member", "add", BAD, "ai2/olmo"), {}, "argument 2 of `member` is not valid UTF-8"),
        (("explain", BAD), {}, "argument 1 of `explain` is not valid UTF-8"),
        (("jobs",), {"GPULEDGER_TOKEN": BAD}, "$GPULEDGER_TOKEN is not valid UTF-8: its value"),
        (("submit", "-A", BAD, "-G", "1", "--", "true"), {}, "--account is not valid UTF-8"),
    ],
)
def test_what_is_not_utf8_is_one_line_on_every_command(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    args: tuple[str, ...],
    env: dict[str, str],
    want: str,
) -> None:
    for name in ("GPULEDGER_USER", "GPULEDGER_URL", "GPULEDGER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULEDGER_HOME", str(tmp_path / "home"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, err = run(capsys, *args)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"error: {want}") and err[0].endswith("[invalid]"), err[0]
    assert BAD not in err[0]  # the byte as \xe9, never a token's value


@pytest.mark.parametrize(
    ("lines", "want"),
    [
        (b"#SBATCH -J n\xe9\n", r"-J/--job-name is not valid UTF-8: 'n\xe9'"),
        (b"#SBATCH --export=ALL,A=\xe9\n", "environment variable 'A' cannot be sent: its value "
         "is not valid UTF-8"),
        (b"#GPULEDGER --label k=\xe9\n", r"--labels is not valid UTF-8: '\xe9'"),
    ],
)  # fmt: skip
def test_what_is_not_utf8_in_a_scripts_directives_is_refused_as_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    lines: bytes,
    want: str,
) -> None:
    """atk47-23 F2: the script was read with its bytes replaced by U+FFFD, so `#SBATCH -J n\\xe9`
    ran as a job named `n\\ufffd` (and an --export value the user did not write) where the same
    options on the command line are refused."""
    for name in ("GPULEDGER_USER", "GPULEDGER_URL", "GPULEDGER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULEDGER_HOME", str(tmp_path / "home"))
    script = tmp_path / "b.sh"
    script.write_bytes(b"#!/bin/sh\n" + lines + b"echo hi\n")
    code, err = run(capsys, "submit", "-A", "lab/p1", "-G", "1", "-t", "5m", str(script))
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"error: {want}") and err[0].endswith("[invalid]"), err[0]


def test_a_refused_export_name_or_propagate_limit_shows_its_bytes_as_the_others_do() -> None:
    """atk47-23 F2 (cosmetic): `--export=FOO\\xe9=1` and `--propagate=NOFILE\\xe9` printed the
    surrogate escape `'FOO\\udce9'` where every other refusal prints `\\xe9`."""
    from ledger.cli.submit import environment, propagated
    from schemas.errors import InvalidCommand

    with pytest.raises(InvalidCommand, match=r"variable 'FOO\\xe9' cannot be sent"):
        environment("NONE,FOO\udce9=1", {})
    with pytest.raises(InvalidCommand, match=r"--propagate: 'NOFILE\\xe9' is no resource"):
        propagated("NOFILE\udce9", {})
