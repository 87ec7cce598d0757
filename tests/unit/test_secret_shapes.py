"""atk47-23 F1: values of a secret's shape that `submit` sent to the job and the immutable log,
whatever their name (`ledger.core.secret_shapes`), and names that hold passwords. Each leak
below was sent before; each look-alike (certificates, public keys, ordinary base64, UUIDs,
paths) must still be sent."""

from __future__ import annotations

import base64
import hashlib
import re
from urllib.parse import quote, quote_plus

import pytest

from ledger.cli.submit import environment
from ledger.core.secret_shapes import SECRET_NAMES, base64_at_each_alignment, secret_value

# the first line of the base64 body of keys made by openssl for this test (nothing else of them)
BODIES = {
    "RSA PKCS#1 2048 (openssl genrsa -traditional)": "MIIEpAIBAAKCAQEAieQko+0tWD85n9o/NyohphH9kKb5",
    "RSA PKCS#1 1024": "MIICXAIBAAKBgQDH7LcBRB7MH2o+xdP4ZxkLH9P2sb7Pog4bNFeQNk8eJ/+knzTs",
    "DSA": "MIIBygIBAAKBgQCEmI9f4wrre6JAaKd7k5Utdh8LguuDaeUEX+zKgiSyTMu5vbbF",
    "EC SEC1 P-256": "MHcCAQEEIPyVVAxQRtZhjK7P7LfRDHqjG/mqplMbKKQ/uQyhXtpXoAoGCCqGSM49",
    "EC SEC1 P-384": "MIGkAgEBBDB1rvmBP1yaq8KVDEKsKb7TQWej5gIk6e8bb2LeOjE3UELyA9Fj1VZb",
    "EC SEC1 P-521": "MIHcAgEBBEIBZ+rAkVsERYmZfeQQaGr09Py9fxHDeNW4b3nYiPSI3tGdlsRO1p0t",
    "EC PKCS#8 P-256": "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg/JVUDFBG1mGMrs/s",
    "EC PKCS#8 P-384": "MIG2AgEAMBAGByqGSM49AgEGBSuBBAAiBIGeMIGbAgEBBDB1rvmBP1yaq8KVDEKs",
    "Ed25519 PKCS#8": "MC4CAQAwBQYDK2VwBCIEIHTUqJbQdtUH35gVNfiYXSnRghI6yq78ZMuL+VE50XFs",
    "X25519 PKCS#8": "MC4CAQAwBQYDK2VuBCIEIHCF5Ei9xYARziAiKdRCnJwEUXNBcCNbLHJ3Fb5vAbJI",
    "Ed448 PKCS#8": "MEcCAQAwBQYDK2VxBDsEOWMdFbg9b060+on/4r0w0u/ieVsjwiaqj6BDvcBVjqb2",
}  # fmt: skip
BODY = BODIES["RSA PKCS#1 1024"]
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{BODY}\n-----END RSA PRIVATE KEY-----\n"
CERT = (
    "-----BEGIN CERTIFICATE-----\n"
    "MIIC+TCCAeGgAwIBAgIUDl7/D5CAUWY4E/m6t7UXPMwvQcYwDQYJKoZIhvcNAQEL\n"
    "-----END CERTIFICATE-----\n"
)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def sa_json(pad: str) -> str:
    """A GCP service-account key file, `pad` moving its key's byte alignment."""
    return (
        f'{{"type": "service_account", "project_id": "p{pad}", "private_key_id": "ab12", '
        f'"private_key": "{PEM.replace(chr(10), chr(92) + "n")}", "client_email": "x@p.iam"}}'
    )


LEAKS = {
    **{f"body {kind}": body for kind, body in BODIES.items()},
    **{f"GCP service-account JSON base64, pad {n}": b64(sa_json("x" * n)) for n in range(3)},
    "base64 of newline + PEM": b64("\n" + PEM),
    "base64 of two characters + PEM": b64("ab" + PEM),
    "base64 wrapped at 76 (base64 without -w0)": base64.encodebytes(sa_json("").encode()).decode(),
    "URL-safe base64": base64.urlsafe_b64encode(("?>" + PEM).encode()).decode(),
    "base64 of base64, pad 0": b64(b64(PEM)),
    "base64 of base64, pad 1": b64("x" + b64(PEM)),
    "base64 of base64, pad 2": b64(b64("xy" + PEM)),
    "URL-encoded PEM (every byte)": quote(PEM, safe=""),
    "URL-encoded PEM (quote)": quote(PEM),
    "URL-encoded PEM (quote_plus)": quote_plus(PEM),
    "URL-encoded by hand": "%2D%2D%2D%2D%2DBEGIN%20RSA%20PRIVATE%20KEY%2D%2D%2D%2D%2D%0AMIIE",
    "hex-encoded PEM": PEM.encode().hex(),
    "hex-encoded PEM, capitals": PEM.encode().hex().upper(),
    "Stripe live secret key": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "Stripe restricted key": "rk_live_" + "51H8abcDEFghiJKLmnoPQRstu",
    "Stripe test key": "sk_test_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "Google API key": "AIza" + "SyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW",
    "npm token": "npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "PyPI token": "pypi-AgEIcHlwaS5vcmcCJGE4YjQ5ZjE2LWQ4ZjktNDI",
    "SendGrid key": "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",
    "Discord webhook": "https://discord.com/api/webhooks/123456789012345678/AbCdEf-GhIjKlMnOp_q",
    "Discord webhook (discordapp)": "https://discordapp.com/api/webhooks/1234/AbCdEfGhIjKl",
    "Authorization header line": "Authorization: Bearer abcdef123456789",
    "curl header option": "-H 'Authorization: Basic dXNlcjpwYXNzd29yZA=='",
    "Authorization= raw token": "authorization=0123456789abcdef0123456789",
    "pgpass line": "db.example.org:5432:prod:alice:s3cr3t-pw",
    "pgpass file": "# mine\n*:*:*:bob:pw1\nlocalhost:5432:*:alice:pw2\n",
    "docker config JSON": '{"auths": {"ghcr.io": {"auth": "' + b64("u:ghp_x") + '"}}}',
    "kubeconfig YAML token": "users:\n- name: u\n  user:\n    token: eyJhbGciOiJSUzI1NiIsImtpZCI6",
    "kubeconfig YAML client-key-data": "    client-key-data: LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVk=",
    "kubeconfig YAML client-key-data (not a PEM)": "    client-key-data: QUJDREVGR0hJSktMTU5PUA==",
    "JSON password field": '{"user": "a", "password": "hunter2hunter2"}',
}  # fmt: skip


@pytest.mark.parametrize("value", LEAKS.values(), ids=LEAKS.keys())
def test_private_keys_and_tokens_of_every_common_shape_are_never_sent(value: str) -> None:
    assert secret_value(value)
    env, left, _ = environment("ALL", {"PATH": "/bin", "PLAIN_NAME": value})
    assert env == {"PATH": "/bin"} and left == ["PLAIN_NAME"]


def _random_base64(n: int) -> str:
    data = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(n // 43 + 1))
    return base64.b64encode(data).decode()[:n]


KEPT = {
    "certificate": CERT,
    **{f"base64 of a certificate, pad {n}": b64("x" * n + CERT) for n in range(3)},
    "base64 of base64 of a certificate": b64(b64(CERT)),
    "hex of a certificate": CERT.encode().hex(),
    "URL-encoded certificate": quote(CERT, safe=""),
    "kubeconfig certificate-authority-data": "    certificate-authority-data: " + b64(CERT),
    "certificate body": "MIIC+TCCAeGgAwIBAgIUDl7/D5CAUWY4E/m6t7UXPMwvQcYwDQYJKoZIhvcNAQEL",
    "RSA public key (SPKI)": "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAieQko+0tWD85n9o/Nyoh",
    "RSA public key (PKCS#1)": "MIIBCgKCAQEAieQko+0tWD85n9o/NyohphH9kKb5QwbMw7CxabdcIKA7pio3",
    "Ed25519 public key": "MCowBQYDK2VwAyEAey3WAb9l5eyks/N41hgiQtKzB7+7bFOLYbI7zvnp3H4=",
    "EC public key": "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEjj/rB4+/oqRcZxSLJ65H0ApLg4cV",
    "PEM public key": "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAey3WAb9l5eyks/N41hgiQtKz\n",
    "ssh public key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx2Zm9vYmFy user@host",
    "ordinary base64 (16 KB)": _random_base64(16_000),
    "UUID": "3f2b8c1e-9a4d-4e6f-b1c2-7d8e9f0a1b2c",
    "hex digest": hashlib.sha256(b"x").hexdigest() * 4,
    "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin:/opt/cuda-12.2/bin",
    "LD_LIBRARY_PATH with numbers": "/opt/a/1:/opt/b/2:/opt/c:/opt/d:/opt/e",
    "LS_COLORS": "rs=0:di=01;34:ln=01;36:mh=00:pi=40;33:so=01;35:do=01;35:bd=40;33;01",
    "host:port": "db.example.org:5432",
    "SSH_CONNECTION": "10.0.0.1 51234 10.0.0.2 22",
    "a URL": "https://example.org/api/webhooks/docs?page=2",
    "JSON with empty and short fields": '{"auth": "none", "token": "", "password": null}',
    "YAML with a short token": "token: true\npassword: ${PW}",
    "words": "authorization: required; bearer of bad news; begin private key rotation",
    "sk- too short, sk_live too short": "task sk-1 sk_live_x npm_x AIza",
    "the letters SG. in a sentence": "SG.abc is not a key. SG.also.not",
}  # fmt: skip


@pytest.mark.parametrize("value", KEPT.values(), ids=KEPT.keys())
def test_certificates_public_keys_and_ordinary_values_are_still_sent(value: str) -> None:
    assert not secret_value(value)


def test_the_base64_of_a_pem_header_at_each_byte_alignment() -> None:
    assert base64_at_each_alignment(b"-----BEGIN ") == (
        "LS0tLS1CRUdJTi", "0tLS0tQkVHSU4g", "tLS0tLUJFR0lOI"
    )  # fmt: skip
    for n in range(3):
        assert base64_at_each_alignment(b"-----BEGIN ")[n] in b64("x" * n + "-----BEGIN X")


@pytest.mark.parametrize("name", ["DB_PW", "LDAP_BIND_PW", "PW", "AZURE_CREDS", "GIT_CREDS",
                                  "MY_PRIVKEY", "PRIV_KEY"])  # fmt: skip
def test_names_that_hold_passwords_are_never_sent(name: str) -> None:
    assert re.search(SECRET_NAMES, name)
    assert environment("ALL", {name: "x"})[1] == [name]


@pytest.mark.parametrize("name", ["PWD", "OLDPWD", "PWNED", "PW_DIR_LIST", "CREDIT", "PRIVILEGES",
                                  "KUBECONFIG", "GOOGLE_APPLICATION_CREDENTIALS"])  # fmt: skip
def test_names_like_them_are_still_sent(name: str) -> None:
    assert not re.search(SECRET_NAMES, name)


def test_the_example_serve_toml_holds_the_default_name_pattern() -> None:
    """docs/slurm-users.md: examples/serve.toml holds the default, to copy and extend."""
    import tomllib
    from pathlib import Path

    example = Path(__file__).parents[2] / "examples" / "serve.toml"
    assert tomllib.loads(example.read_text())["secret_env"] == SECRET_NAMES


@pytest.mark.parametrize(
    "name",
    ["TOKENIZERS_PARALLELISM", "TIKTOKEN_CACHE_DIR", "HF_TOKEN_PATH", "MAX_TOKENS", "TOKEN_LIMIT"],
)
def test_names_that_say_they_hold_a_path_or_a_setting_are_sent(name: str) -> None:
    """atk47-23 F12: an ML researcher's `TOKENIZERS_PARALLELISM=false` never reached the job."""
    assert not re.search(SECRET_NAMES, name)


@pytest.mark.parametrize("name", ["HF_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY", "DB_PW"])
def test_names_of_secrets_are_still_left_out(name: str) -> None:
    assert re.search(SECRET_NAMES, name)
