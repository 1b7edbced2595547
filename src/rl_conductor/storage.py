"""Read and write local paths and ``s3://bucket/prefix`` URIs through one small API.

Why: checkpoints, datasets, reports and recorded worker outputs live in a local folder on a
laptop and in S3 on a cluster. Every stage (KFP components, training, evaluation, serving)
calls these functions with whatever root it was given, so no caller branches on the scheme.

S3 access uses boto3 with the standard AWS environment variables (``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``).
A client is created on first use, never at import time, and re-created when those variables
change (tests point them at a loopback S3 server).

Deliberate simplifications:
- S3 has no folders; a "folder" is a key prefix. ``list_files``/``sizes`` return paths relative
  to the given root (``/``-separated on both backends), so local and S3 results compare equal.
- Whole objects are read into memory (``read_bytes``); big files go through ``upload_dir`` /
  ``download_dir``, which use boto3's managed (multipart) transfers, one file after another.
- Errors from botocore are mapped to three exception types that name the URI:
  ``NotFoundError`` (missing bucket or key), ``AccessDeniedError`` (bad key, secret or policy)
  and ``StorageError`` for everything else.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_conductor.errors import UserError

__all__ = [
    "HOME_ENV",
    "AccessDeniedError",
    "NotFoundError",
    "StorageError",
    "conductor_home",
    "delete",
    "download_dir",
    "exists",
    "is_s3",
    "join",
    "list_files",
    "read_bytes",
    "read_json",
    "read_text",
    "sizes",
    "split_s3",
    "upload_dir",
    "write_bytes",
    "write_json",
    "write_text",
]

S3_SCHEME = "s3://"
#: The root that holds ``.conductor/`` (the local MLflow store, caches, artifacts).
HOME_ENV = "CONDUCTOR_HOME"


def conductor_home() -> Path:
    """``$CONDUCTOR_HOME`` or the current directory: the root that holds ``.conductor/``."""
    return Path(os.environ.get(HOME_ENV) or os.getcwd()).resolve()


_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "InvalidToken",
        "ExpiredToken",
        "AuthorizationHeaderMalformed",
        "403",
    }
)
_MISSING_KEY_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


class StorageError(UserError):
    """A storage operation failed; ``uri`` says on what (the CLI shows it in one line, exit 1)."""

    def __init__(self, message: str, uri: str) -> None:
        super().__init__(message)
        self.uri = uri


class NotFoundError(StorageError, FileNotFoundError):
    """The bucket, object or local file does not exist."""


class AccessDeniedError(StorageError, PermissionError):
    """The server refused the credentials or the policy forbids the operation."""


def is_s3(uri: str) -> bool:
    """True for ``s3://`` URIs, False for local paths."""
    return str(uri).startswith(S3_SCHEME)


def split_s3(uri: str) -> tuple[str, str]:
    """Split ``s3://bucket/some/key`` into ``("bucket", "some/key")``."""
    if not is_s3(uri):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


def join(root: str | os.PathLike[str], *parts: str) -> str:
    """Join path parts below ``root`` (``/`` for S3, the OS separator for local paths)."""
    root = str(root)
    if is_s3(root):
        cleaned = [p.strip("/") for p in parts if p and p.strip("/")]
        return posixpath.join(root.rstrip("/"), *cleaned) if cleaned else root
    return os.path.join(root, *parts)


# --------------------------------------------------------------------------- S3 client


@dataclass(frozen=True)
class _S3Settings:
    endpoint_url: str | None
    access_key: str | None
    secret_key: str | None
    session_token: str | None
    region: str | None

    @classmethod
    def from_env(cls) -> _S3Settings:
        env = os.environ
        return cls(
            endpoint_url=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
            access_key=env.get("AWS_ACCESS_KEY_ID"),
            secret_key=env.get("AWS_SECRET_ACCESS_KEY"),
            session_token=env.get("AWS_SESSION_TOKEN"),
            region=env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION"),
        )


_clients: dict[_S3Settings, Any] = {}
_clients_lock = threading.Lock()


def _s3() -> Any:
    """The boto3 S3 client for the current environment (created on first use, then cached)."""
    settings = _S3Settings.from_env()
    with _clients_lock:
        client = _clients.get(settings)
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                retries={"max_attempts": 3, "mode": "standard"},
                # Custom endpoints (MinIO, SeaweedFS, Ceph) rarely have per-bucket DNS names.
                s3={"addressing_style": "path" if settings.endpoint_url else "auto"},
            )
            client = boto3.session.Session().client(
                "s3",
                endpoint_url=settings.endpoint_url,
                aws_access_key_id=settings.access_key,
                aws_secret_access_key=settings.secret_key,
                aws_session_token=settings.session_token,
                region_name=settings.region or "us-east-1",
                config=config,
            )
            _clients[settings] = client
        return client


def _translate(exc: Exception, uri: str) -> StorageError:
    """Turn a botocore exception into a StorageError that names the URI and the fix."""
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

    bucket = split_s3(uri)[0]
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return NotFoundError(f"bucket {bucket!r} does not exist (while accessing {uri})", uri)
        if code in _ACCESS_CODES or status == 403:
            return AccessDeniedError(
                f"access denied to {uri} ({code}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
                f"and the bucket policy for {bucket!r}",
                uri,
            )
        if code in _MISSING_KEY_CODES or status == 404:
            return NotFoundError(f"no such object: {uri}", uri)
        return StorageError(f"S3 error on {uri}: {code} {error.get('Message', '')}".rstrip(), uri)
    if isinstance(exc, NoCredentialsError):
        return AccessDeniedError(
            f"no S3 credentials for {uri}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", uri
        )
    if isinstance(exc, EndpointConnectionError):
        endpoint = _S3Settings.from_env().endpoint_url or "the default AWS endpoint"
        return StorageError(f"cannot reach S3 at {endpoint} (while accessing {uri}): {exc}", uri)
    if isinstance(exc, BotoCoreError):
        return StorageError(f"S3 client error on {uri}: {exc}", uri)
    return StorageError(f"S3 error on {uri}: {exc}", uri)


def _boto_errors() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (ClientError, BotoCoreError)


def _prefix(key: str) -> str:
    """A key prefix that matches only objects below ``key`` taken as a folder."""
    key = key.strip("/")
    return f"{key}/" if key else ""


def _iter_s3_objects(uri: str) -> list[tuple[str, int]]:
    """(relative key, size) of every object below the S3 "folder" ``uri``."""
    bucket, key = split_s3(uri)
    prefix = _prefix(key)
    out: list[tuple[str, int]] = []
    try:
        paginator = _s3().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) :]
                if rel and not rel.endswith("/"):
                    out.append((rel, int(obj["Size"])))
    except _boto_errors() as exc:
        raise _translate(exc, uri) from exc
    return sorted(out)


# --------------------------------------------------------------------------- single objects


def write_bytes(uri: str, data: bytes) -> None:
    """Write ``data`` to ``uri``, creating local parent folders; local writes are atomic."""
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        try:
            _s3().put_object(Bucket=bucket, Key=key, Body=data)
        except _boto_errors() as exc:
            raise _translate(exc, uri) from exc
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        # mkstemp creates 0600; written artifacts get the ordinary umask-based mode
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_bytes(uri: str) -> bytes:
    """The whole content of ``uri``; raises NotFoundError when it does not exist."""
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        try:
            body: bytes = _s3().get_object(Bucket=bucket, Key=key)["Body"].read()
        except _boto_errors() as exc:
            raise _translate(exc, uri) from exc
        return body
    try:
        return Path(uri).read_bytes()
    except FileNotFoundError as exc:
        raise NotFoundError(f"no such file: {uri}", uri) from exc


def write_text(uri: str, text: str) -> None:
    """Write UTF-8 text."""
    write_bytes(uri, text.encode("utf-8"))


def read_text(uri: str) -> str:
    """Read UTF-8 text."""
    return read_bytes(uri).decode("utf-8")


def write_json(uri: str, value: Any, *, indent: int | None = 2) -> None:
    """Write ``value`` as JSON (keys kept in insertion order, non-ASCII kept as is)."""
    write_text(uri, json.dumps(value, indent=indent, ensure_ascii=False) + "\n")


def read_json(uri: str) -> Any:
    """Parse the JSON document at ``uri``."""
    return json.loads(read_text(uri))


def exists(uri: str) -> bool:
    """True when ``uri`` is a file/object or a non-empty folder/prefix.

    A missing bucket is a configuration error, not a missing file: it raises NotFoundError.
    """
    uri = str(uri)
    if not is_s3(uri):
        return os.path.exists(uri)
    bucket, key = split_s3(uri)
    client = _s3()
    from botocore.exceptions import ClientError

    if key and not key.endswith("/"):
        try:
            client.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 404:
                raise _translate(exc, uri) from exc
        except _boto_errors() as exc:
            raise _translate(exc, uri) from exc
    try:
        # HEAD answers 404 for a missing bucket too; listing tells the two apart.
        page = client.list_objects_v2(Bucket=bucket, Prefix=_prefix(key), MaxKeys=1)
    except _boto_errors() as exc:
        raise _translate(exc, uri) from exc
    return bool(page.get("KeyCount", 0) or page.get("Contents"))


def delete(uri: str) -> None:
    """Remove the file or object ``uri``; a missing one is not an error (retention sweeps race)."""
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        try:
            _s3().delete_object(Bucket=bucket, Key=key)
        except _boto_errors() as exc:
            raise _translate(exc, uri) from exc
        return
    Path(uri).unlink(missing_ok=True)


# --------------------------------------------------------------------------- folders


def list_files(uri: str) -> list[str]:
    """Files below the folder ``uri``, recursively, as sorted ``/``-separated relative paths.

    A missing folder (or empty prefix) gives an empty list.
    """
    return sorted(sizes(uri))


def sizes(uri: str) -> dict[str, int]:
    """Bytes per file below the folder ``uri``, keyed by relative path (for reports)."""
    uri = str(uri)
    if is_s3(uri):
        return dict(_iter_s3_objects(uri))
    root = Path(uri)
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def upload_dir(local_dir: str | os.PathLike[str], uri: str) -> list[str]:
    """Copy every file of ``local_dir`` below ``uri`` (S3 or local); returns the relative paths."""
    src = Path(local_dir)
    if not src.is_dir():
        raise NotFoundError(f"not a folder: {src}", str(src))
    rels = [p.relative_to(src).as_posix() for p in sorted(src.rglob("*")) if p.is_file()]
    uri = str(uri)
    if not is_s3(uri):
        shutil.copytree(src, uri, dirs_exist_ok=True)
        return rels
    bucket, key = split_s3(uri)
    prefix = _prefix(key)
    client = _s3()
    for rel in rels:
        target = f"{S3_SCHEME}{bucket}/{prefix}{rel}"
        try:
            client.upload_file(str(src / rel), bucket, prefix + rel)
        except _boto_errors() as exc:
            raise _translate(exc, target) from exc
        except Exception as exc:  # boto3's transfer manager wraps ClientError in S3UploadFailedError
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, _boto_errors()):
                raise _translate(cause, target) from exc
            raise StorageError(f"upload of {src / rel} to {target} failed: {exc}", target) from exc
    return rels


def local_target(root: Path, rel: str, *, source: str) -> Path:
    """Where an object's relative key ``rel`` lands below the local folder ``root``.

    Object keys are not paths: S3 (AWS, MinIO) stores ``a/../../x``, ``a//etc/passwd`` or
    ``/x`` as they are, and a key joined to a folder unchecked writes wherever it points. A key
    with an empty, ``.`` or ``..`` segment, a leading ``/``, a backslash or a NUL byte is
    refused with :class:`StorageError` naming it, as is any key whose path (symlinks followed)
    leaves ``root``."""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts) or "\\" in rel or "\0" in rel:
        raise StorageError(
            f"refusing object key {rel!r} below {source}: a key with an empty, '.' or '..' part, a "
            f"leading '/', a backslash or a NUL would be written outside {root}",
            source,
        )
    target = root / Path(*parts)
    base = root.resolve()
    if not target.resolve().is_relative_to(base):
        raise StorageError(f"refusing object key {rel!r} below {source}: it resolves outside {root}", source)
    return target


def download_dir(uri: str, local_dir: str | os.PathLike[str]) -> str:
    """Copy every file below ``uri`` into ``local_dir`` (created); returns ``local_dir``.

    Every key is checked before anything is written (:func:`local_target`): a hostile key
    refuses the whole download.

    Raises NotFoundError when there is nothing below ``uri``; StorageError for a key that would
    land outside ``local_dir``.
    """
    uri = str(uri)
    dst = Path(local_dir)
    if not is_s3(uri):
        if not Path(uri).is_dir():
            raise NotFoundError(f"not a folder: {uri}", uri)
        shutil.copytree(uri, dst, dirs_exist_ok=True)
        return str(dst)
    objects = _iter_s3_objects(uri)
    if not objects:
        raise NotFoundError(f"nothing stored below {uri}", uri)
    bucket, key = split_s3(uri)
    prefix = _prefix(key)
    targets = [(rel, local_target(dst, rel, source=uri)) for rel, _size in objects]
    client = _s3()
    for rel, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            client.download_file(bucket, prefix + rel, str(target))
        except _boto_errors() as exc:
            raise _translate(exc, f"{S3_SCHEME}{bucket}/{prefix}{rel}") from exc
    return str(dst)
