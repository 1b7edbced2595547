"""Who may call the predictor: bearer API keys, read once at start from a file or the environment.

Why keys and not nothing: every inference spends the operator's external-API budget, so a client
must prove it was given access. A Kubernetes Secret mounted as a file (``--api-key-file``) or
exposed as an environment variable (``CONDUCTOR_API_KEYS``) carries one or more keys, so a key can
be rotated by adding the new one, rolling the clients, then removing the old one.

Rules:

* a key file holds one key per line; blank lines and lines starting with ``#`` are skipped. The
  variable holds keys separated by commas or newlines. Both sources add up.
* a key is at least :data:`MIN_KEY_CHARS` printable ASCII characters without spaces (a short or
  odd key is a mistake an operator should hear about at start, not a weak lock).
* a request sends ``Authorization: Bearer KEY`` (what the OpenAI SDK sends as ``api_key``); the
  key is compared with every configured key in constant time (:func:`hmac.compare_digest`), all
  of them every time, so the comparison says nothing about which key or how much of it matched.
* no keys and no explicit ``--auth none`` is a start-up error: an open predictor must be chosen.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: Environment variable with keys (commas or newlines between them).
KEYS_ENV = "CONDUCTOR_API_KEYS"
#: Shortest key accepted.
MIN_KEY_CHARS = 16


class AuthConfigError(ValueError):
    """The key configuration is unusable; the message says which source and why."""


@dataclass(frozen=True)
class ApiKeys:
    """The accepted keys (as bytes, for :func:`hmac.compare_digest`)."""

    keys: tuple[bytes, ...]

    def accepts(self, authorization: str | None) -> bool:
        """True when ``authorization`` is ``Bearer KEY`` with a configured key."""
        if not authorization:
            return False
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = token.strip().encode("latin-1", "replace")
        # compare against every key, no early exit
        matches = [hmac.compare_digest(given, key) for key in self.keys]
        return any(matches)


def _check(key: str, where: str) -> str:
    if len(key) < MIN_KEY_CHARS:
        raise AuthConfigError(f"{where}: a key must have at least {MIN_KEY_CHARS} characters")
    if not all(33 <= ord(c) <= 126 for c in key):
        raise AuthConfigError(f"{where}: a key must be printable ASCII without spaces")
    return key


def _from_lines(lines: Iterable[str], where: str) -> list[str]:
    out = []
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            out.append(_check(line, f"{where} line {n}"))
    return out


def load_keys(key_file: str | None, environ: dict[str, str] | None = None) -> ApiKeys | None:
    """The keys from ``key_file`` and :data:`KEYS_ENV`; None when neither gives any.

    Raises :class:`AuthConfigError` for a file that cannot be read, a malformed key, or a file
    that is given but holds no key."""
    env = os.environ if environ is None else environ
    keys: list[str] = []
    if key_file:
        try:
            text = Path(key_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthConfigError(f"--api-key-file {key_file}: cannot read it ({exc})") from None
        found = _from_lines(text.splitlines(), f"--api-key-file {key_file}")
        if not found:
            raise AuthConfigError(f"--api-key-file {key_file}: holds no key")
        keys += found
    raw = env.get(KEYS_ENV, "")
    if raw.strip():
        keys += _from_lines(raw.replace(",", "\n").splitlines(), KEYS_ENV)
    if not keys:
        return None
    return ApiKeys(tuple(dict.fromkeys(k.encode("ascii") for k in keys)))
