"""Which environment variables are secrets: by name (`SECRET_NAMES`) and by the value's shape
(`secret_value`). Pure; both `submit` (before it sends anything) and the server's `admit` (before
it appends) leave them out: an event in the log is never removed.

Every shape is searched in time linear in the value's length (`scripts/bench_secrets.py`): each
is a plain regular expression whose repeats stop at a character the next part needs or are
bounded, and an encoded private key is found in two steps: a fixed trigger (the encoding of
`-----BEGIN `), then a bounded window after it decoded and looked into for `PRIVATE KEY`.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from urllib.parse import unquote_plus

PATH_NAMES = (
    "GOOGLE_APPLICATION_CREDENTIALS", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
    "KUBECONFIG",
)  # fmt: skip
"""Well-known variables that hold the *path* of a credentials file, not a secret: sent like any
other (the file stays readable by its owner alone), though their names look like secrets."""
NOT_SECRET_NAMES = (
    r"(?!.*_(PATH|DIR|FILE|CACHE|CACHE_DIR|PARALLELISM|LEN|LENGTH|COUNT|SIZE|LIMIT)$)"
    r"(?!(MAX|MIN|NUM)_)(?!TOKENIZERS_)"
)
"""Names that say what they hold is no secret though a word of theirs looks like one: a path
(`HF_TOKEN_PATH`, `TIKTOKEN_CACHE_DIR`), a number or a setting (`MAX_TOKENS`,
`TOKENIZERS_PARALLELISM`, `TOKEN_LIMIT`). They were left out of every job (atk47-23 F12): an ML
researcher's `TOKENIZERS_PARALLELISM=false` never reached the job. A value of a secret's shape
is left out whatever its name (`secret_value`)."""

SECRET_NAMES = (
    rf"(?i)^(?!(?:{'|'.join(PATH_NAMES)})$){NOT_SECRET_NAMES}.*?"
    r"(TOKEN|SECRET|PASS(WORD|WD|PHRASE)|(^|_|SSH|PG)PASS($|_)|_PWD$|(^|_)PW$|CREDENTIAL|CREDS"
    r"|PRIVATE_?KEY|PRIV_?KEY|APIKEY|COOKIE|(^|_)KEY($|_)|(^|_)PAT$|(^|_)AUTH($|_)"
    r"|AUTHORI[SZ]ATION|JWT(_V[0-9]+)?$|(^|_)DSN$|SAS_?(SIG|URL|KEY)|(^|_)SIG($|_))"
)
"""The environment variables a job is never sent with by default: names that hold tokens,
passwords, keys and sessions (the submitter's own `GPULEDGER_TOKEN` first of all; `OPENAI_KEY`,
`GITHUB_PAT`, `WANDB_KEY`, `SSHPASS`, `DB_PASSWORD`, `AWS_SECRET_ACCESS_KEY`, `NPM_AUTH`,
`HF_AUTH_TOKEN`, `SESSION_COOKIE`, `DB_PWD`, `DB_PW`, `AZURE_CREDS`, `AUTHORIZATION`,
`HTTP_AUTHORIZATION`, `CI_JOB_JWT`, `SENTRY_DSN`, `PRIVATEKEY`, `MY_PRIVKEY`, `PGPASS`,
`AZURE_SAS_SIG`), but not `PATH_NAMES` (nor `GIT_AUTHOR_NAME`: AUTH only as a word or in
AUTHORIZATION), nor names where `PASS` is part of another word (`TOX_TESTENV_PASSENV`,
`BYPASS_CACHE`: a submitter's every job would otherwise carry a note about a variable that
holds no secret). A site sets its own pattern (`secret_env` in serve.toml); the CLI leaves
these out before it sends anything. A value of a secret's shape (`secret_value`) is never sent
either, whatever its name."""

_B64 = "[A-Za-z0-9+/]"
SECRET_SHAPES: tuple[tuple[str, str], ...] = (
    ("a password in a URL (scheme://user:password@host)",
     r"(?<=[A-Za-z0-9+.-])://[^/\s:@]*:[^/\s@]+@"),
    ("a connection string's key or password (AccountKey=, SharedAccessKey=, Password=)",
     r"(?i:(?:^|;)\s*(?:AccountKey|SharedAccessKey|Password|Pwd)\s*=)"),
    ("a Slack or Discord webhook",
     r"(?i:hooks\.slack\.com/|discord(?:app)?\.com/api/webhooks/)"),
    ("a Sentry DSN (its key is the URL's user)", r"(?i:://[^/\s:@]+@[^/\s]*sentry\.io)"),
    ("a token of a well-known service: GitHub ghp_/gho_/ghu_/ghs_/ghr_/github_pat_, "
     "OpenAI/Anthropic sk-, Slack xox?-, Hugging Face hf_, GitLab glpat-, AWS AKIA/ASIA, "
     "Stripe sk_live_/rk_live_ (and _test_), Google AIza, npm npm_, PyPI pypi-AgEI, "
     "SendGrid SG.x.y, a signed JWT eyJ...eyJ...",
     r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,}"
     r"|sk-[A-Za-z0-9_-]{32,}|xox[abposr]-[A-Za-z0-9-]{10,}|hf_[A-Za-z0-9]{30,}"
     r"|glpat-[A-Za-z0-9_-]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"
     r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}|AIza[0-9A-Za-z_-]{35}|npm_[A-Za-z0-9]{36}"
     r"|pypi-AgEI[A-Za-z0-9_-]{16,}|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"
     r"|eyJ(?:[A-Za-z0-9]|[_-](?!eyJ)){8,}\.eyJ[A-Za-z0-9_-]{8,}\.)"),
    ("an HTTP Authorization header or its value (Bearer ..., Basic ..., Token ...)",
     r"(?i:^\s*(?:Bearer|Basic|Token)\s+[A-Za-z0-9+/=._~-]{8,}\s*$"
     r"|authori[sz]ation[\"']?[ \t]*[:=][ \t]*[\"']?"
     r"(?:(?:Bearer|Basic|Token|Digest|Negotiate)[ \t]+[A-Za-z0-9+/=._~-]{8,}"
     r"|[A-Za-z0-9+/=._~-]{20,}))"),
    ("a SAS signature (sig=)", r"(?i:[?&]sig=[A-Za-z0-9%+/=]{8,})"),
    ("a pgpass line (host:port:database:user:password)",
     r"(?m:^[^:\s#][^:\s]*:(?:[0-9]{1,5}|\*):[^:\s]+:[^:\s]+:[^\n]+$)"),
    ("a JSON credential field (a docker config's \"auth\", \"password\", \"token\", ...)",
     r"\"(?:auth|identitytoken|registrytoken|password|secret|client_secret|private_key"
     r"|token|access_token|refresh_token|api_key|apikey)\"[ \t]*:[ \t]*\"[^\"\s]{8,}\""),
    ("a YAML credential field (a kubeconfig's token:, client-key-data:, password:)",
     r"(?m:^[ \t-]*(?:token|client-key-data|id-token|refresh-token|password|client-secret)"
     r"[ \t]*:[ \t]*[\"']?[A-Za-z0-9+/=._~-]{8,})"),
    ("a PEM private key of any kind (PKCS#1/#8, EC, OpenSSH, encrypted, PGP's PRIVATE KEY "
     "BLOCK, ssh.com's SSH2 ENCRYPTED PRIVATE KEY), a PuTTY key file, an age secret key",
     r"-{4,5} ?BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY"
     r"|PuTTY-User-Key-File-[0-9]+:|AGE-SECRET-KEY-1[0-9A-Z]{58}"),
    ("a private key's base64 body without its PEM header: OpenSSH; PKCS#1 RSA or DSA "
     "(MII..IBAAK); PKCS#8 of any kind (MII..IBAD, MIG.AgEAM, MC4CAQAw: RSA, EC, Ed25519, "
     "X25519, Ed448); EC SEC1 (MHcCAQEE, MIGkAgEBBD, MIHcAgEBBE); PKCS#12 (MII..IBAz)",
     rf"b3BlbnNzaC1rZXktdjE|ADANBgkqhkiG9w0BAQEFAAS|MII{_B64}{{3}}IBA(?:AK|D[AC]|z)|MI[GH]{_B64}AgE(?:AM|BB)"
     rf"|M[A-H]{_B64}CAQ(?:Aw|EE)"),
)  # fmt: skip
"""Values that are secrets whatever their name: what each shape is, and its pattern. A private
key base64-, hex- or URL-encoded whole (a Kubernetes secret's or a CI variable's way, a GCP
service-account JSON base64-encoded) is found apart (`secret_value`). Built in: a site adds
names with `secret_env`, not shapes."""
SECRET_VALUE = re.compile("|".join(f"(?:{pattern})" for _, pattern in SECRET_SHAPES))
"""The shapes as one search (each alternative starts with a fixed character or a bounded
class, so the search is linear: a scheme is matched from its `://` back, a JWT's first part
stops at the next `-eyJ` or `_eyJ`)."""
_NETRC_MACHINE = re.compile(r"(?i)\bmachine\s+\S")
_NETRC_PASSWORD = re.compile(r"(?i)\bpassword\s+\S")
_PEM_START = b"-----BEGIN "


def base64_at_each_alignment(data: bytes) -> tuple[str, ...]:
    """Pure: the base64 characters `data` always encodes to, at each of the three byte offsets
    it may start at in what is encoded (0, 1, 2 mod 3): those that share no bit with the bytes
    around it (`-----BEGIN ` is `LS0tLS1CRUdJTi`, `0tLS0tQkVHSU4g`, `tLS0tLUJFR0lO`)."""
    out = []
    for shift in range(3):
        text = base64.b64encode(b"\0" * shift + data).decode()
        out.append(text[(shift * 8 + 5) // 6 : (shift + len(data)) * 8 // 6])
    return tuple(out)


def _skip(shift: int) -> int:
    """How many characters before a trigger of `base64_at_each_alignment`'s `shift` its
    base64 group starts."""
    return (0, 2, 3)[shift]


def _from_base64(text: str) -> bytes:
    text = text.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text[: len(text) // 4 * 4])
    except binascii.Error:
        return b""


def _from_hex(text: str) -> bytes:
    return bytes.fromhex(text[: len(text) // 2 * 2])


def _from_url(text: str) -> bytes:
    return unquote_plus(text).encode("utf-8", "replace")


_B64_RUN = "[A-Za-z0-9+/_-]"
Decoder = Callable[[str], bytes]
_ENCODED_PEM: tuple[tuple[re.Pattern[str], int, Decoder], ...] = (
    *(
        (re.compile(f"{re.escape(t)}{_B64_RUN}{{0,96}}"), _skip(s), _from_base64)
        for s, t in enumerate(base64_at_each_alignment(_PEM_START))
    ),
    (re.compile(r"(?i)2d2d2d2d(?:2d)?(?:20)?424547494e20[0-9a-f]{0,120}"), 0, _from_hex),
    (re.compile(r"(?i)(?:-|%2D){4,5}(?:%20|\+)?BEGIN(?:%20|\+)[A-Za-z0-9%+-]{0,120}"), 0,
     _from_url),
)  # fmt: skip
"""A PEM file encoded whole: a trigger (the encoding of `-----BEGIN `, base64 at each byte
alignment, hex, URL-encoding), how many characters before it the encoded group starts, and the
decoder of the bounded window that follows."""
_B64_OF_B64_PEM = tuple(
    (re.compile(f"{re.escape(outer)}{_B64_RUN}{{0,160}}"), _skip(shift))
    for inner in base64_at_each_alignment(_PEM_START)
    for shift, outer in enumerate(base64_at_each_alignment(inner.encode()))
)
"""Base64 of base64 of a PEM file (a Kubernetes secret's data of a base64 value): the triggers
of the inner base64 triggers, at each alignment."""


def _encoded_private_key(value: str) -> bool:
    """Pure: whether `value` holds a PEM private key encoded whole (base64 at any alignment,
    hex, URL-encoded): every window decoded is bounded, so the time is linear."""
    for pattern, back, decode in _ENCODED_PEM:
        for found in pattern.finditer(value):
            start = found.start() - back
            window = "A" * max(0, -start) + value[max(0, start) : found.end()]
            if b"PRIVATE KEY" in decode(window):
                return True
    for pattern, back in _B64_OF_B64_PEM:
        for found in pattern.finditer(value):
            start = found.start() - back
            window = "A" * max(0, -start) + value[max(0, start) : found.end()]
            if _encoded_private_key(_from_base64(window).decode("latin-1")):
                return True
    return False


def secret_value(value: str) -> bool:
    """Pure: whether an environment value is a secret by its shape (`SECRET_SHAPES`, a netrc
    line, a private key encoded whole), in time linear in its length. A value wrapped in lines
    (`base64` without `-w0`) is looked into joined too."""
    if SECRET_VALUE.search(value):
        return True
    machine = _NETRC_MACHINE.search(value)
    if machine and _NETRC_PASSWORD.search(value, machine.end()):
        return True
    if _encoded_private_key(value):
        return True
    joined = "".join(value.split())
    return joined != value and _encoded_private_key(joined)
