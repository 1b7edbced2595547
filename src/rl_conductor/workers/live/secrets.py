"""API keys: read from the environment variables a pool file names, and kept out of every output.

Why: keys live in Kubernetes Secrets mounted as environment variables, never in pool files. A key
that reaches a log line, a trace, an MLflow run or an exception message has leaked, so every
key this module hands out is registered, and

* :func:`redact` replaces registered keys in any text (worker errors pass through it);
* a log-record factory, installed once, redacts every log record of the process (the SDKs' and
  httpx's debug logs included) before any handler sees it.

Simplification: redaction is by exact value (keys shorter than 8 characters are not registered,
so that "EMPTY" or "x" placeholders do not blank out ordinary words).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from rl_conductor.workers.kinds import PoolConfigError

REDACTED = "***"
_MIN_SECRET_LEN = 8
_secrets: set[str] = set()
_lock = threading.Lock()
_installed = False


def register_secret(value: str) -> None:
    """Redact ``value`` from every later log record and from :func:`redact`."""
    if len(value) >= _MIN_SECRET_LEN:
        with _lock:
            _secrets.add(value)
        _install_log_redaction()


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``***``."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _install_log_redaction() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if not _secrets:
            return record
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is left to logging to report
            return record
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return record

    logging.setLogRecordFactory(factory)


def api_key_from_env(spec: dict[str, Any], *, required: bool = True) -> str | None:
    """The API key of a worker entry, from the variable its ``api_key_env`` names.

    Raises:
        PoolConfigError: ``api_key_env`` is missing although a key is required, or the variable
            is unset or empty (the message names the variable, never a value).
    """
    name = spec.get("name")
    var = spec.get("api_key_env")
    if var is None:
        if required:
            raise PoolConfigError(
                f"worker {name!r}: `api_key_env` must name the environment variable that holds its API key"
            )
        return None
    if not isinstance(var, str) or not var.strip():
        raise PoolConfigError(f"worker {name!r}: `api_key_env` must be an environment variable name")
    value = os.environ.get(var, "")
    if not value.strip():
        raise PoolConfigError(
            f"worker {name!r}: environment variable {var} is not set; it must hold the API key "
            "(on a cluster, mount it from a Kubernetes Secret)"
        )
    register_secret(value)
    return value
