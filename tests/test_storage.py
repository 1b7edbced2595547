"""storage: the same calls on local folders and on a real S3 server (SeaweedFS, SigV4 enforced)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_conductor import storage
from rl_conductor.storage import AccessDeniedError, NotFoundError, StorageError


def _make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "config.json": b'{"model_type": "qwen2"}\n',
        "tokenizer/tokenizer.json": b'{"vocab": {}}',
        "tokenizer/deep/merges.txt": b"a b\n",
        "weights.bin": os.urandom(70_000),
        "empty.txt": b"",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A storage root on either backend; the same assertions must hold on both."""
    if request.param == "local":
        return str(tmp_path / "store")
    bucket: str = request.getfixturevalue("s3_bucket")
    return storage.join(bucket, "runs", "r1")


def test_scheme_helpers() -> None:
    assert storage.is_s3("s3://b/k") and not storage.is_s3("/tmp/s3://x")
    assert storage.split_s3("s3://bucket/a/b.txt") == ("bucket", "a/b.txt")
    assert storage.split_s3("s3://bucket") == ("bucket", "")
    assert storage.join("s3://bucket/", "/a/", "b.txt") == "s3://bucket/a/b.txt"
    assert storage.join("s3://bucket/pre") == "s3://bucket/pre"
    assert storage.join("/tmp/x", "a", "b.txt") == os.path.join("/tmp/x", "a", "b.txt")
    with pytest.raises(ValueError, match="without a bucket"):
        storage.split_s3("s3:///key")
    with pytest.raises(ValueError, match="not an s3"):
        storage.split_s3("/local/path")


def test_objects_round_trip(root: str) -> None:
    storage.write_text(storage.join(root, "notes", "a.txt"), "héllo\n")
    storage.write_bytes(storage.join(root, "blob.bin"), b"\x00\x01\xff")
    storage.write_json(storage.join(root, "report.json"), {"accuracy": 0.5, "rows": [1, 2], "name": "é"})

    assert storage.read_text(storage.join(root, "notes", "a.txt")) == "héllo\n"
    assert storage.read_bytes(storage.join(root, "blob.bin")) == b"\x00\x01\xff"
    assert storage.read_json(storage.join(root, "report.json")) == {
        "accuracy": 0.5,
        "rows": [1, 2],
        "name": "é",
    }
    assert storage.exists(storage.join(root, "blob.bin"))
    assert storage.exists(storage.join(root, "notes"))  # a folder / prefix with files in it
    assert not storage.exists(storage.join(root, "nope.txt"))
    assert not storage.exists(storage.join(root, "not"))  # "not" is a prefix of "notes" but no folder
    assert storage.list_files(root) == ["blob.bin", "notes/a.txt", "report.json"]
    assert storage.sizes(root)["blob.bin"] == 3
    assert storage.list_files(storage.join(root, "missing")) == []

    with pytest.raises(NotFoundError, match=r"nope\.txt") as info:
        storage.read_bytes(storage.join(root, "nope.txt"))
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.uri == storage.join(root, "nope.txt")


def test_overwrite_replaces_content(root: str) -> None:
    uri = storage.join(root, "state.json")
    storage.write_json(uri, {"step": 1})
    storage.write_json(uri, {"step": 2})
    assert storage.read_json(uri) == {"step": 2}
    assert storage.list_files(root) == ["state.json"]  # no temporary files left behind


def test_dir_round_trip(root: str, tmp_path: Path) -> None:
    src = tmp_path / "model"
    files = _make_tree(src)
    uploaded = storage.upload_dir(src, storage.join(root, "model"))
    assert sorted(uploaded) == sorted(files)
    assert storage.sizes(storage.join(root, "model")) == {k: len(v) for k, v in files.items()}
    # a sibling whose name extends the prefix must not leak into the listing
    storage.write_text(storage.join(root, "model-old", "x.txt"), "old")
    assert storage.list_files(storage.join(root, "model")) == sorted(files)

    dst = tmp_path / "downloaded"
    assert storage.download_dir(storage.join(root, "model"), dst) == str(dst)
    assert _read_tree(dst) == files

    with pytest.raises(NotFoundError):
        storage.download_dir(storage.join(root, "nothing-here"), tmp_path / "nothing")


def test_multipart_upload_and_download(s3_bucket: str, tmp_path: Path) -> None:
    big = tmp_path / "big" / "weights.safetensors"
    big.parent.mkdir()
    data = os.urandom(9 * 1024 * 1024)  # above boto3's 8 MiB multipart threshold
    big.write_bytes(data)
    storage.upload_dir(big.parent, f"{s3_bucket}/ckpt")
    assert storage.sizes(f"{s3_bucket}/ckpt") == {"weights.safetensors": len(data)}
    storage.download_dir(f"{s3_bucket}/ckpt", tmp_path / "back")
    assert (tmp_path / "back" / "weights.safetensors").read_bytes() == data


def test_wrong_secret_is_refused(s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"{s3_bucket}/secret/report.json"
    storage.write_json(uri, {"ok": True})
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")

    with pytest.raises(AccessDeniedError, match=r"access denied to s3://.*/secret/report\.json") as info:
        storage.read_json(uri)
    assert isinstance(info.value, PermissionError)
    with pytest.raises(AccessDeniedError, match="SignatureDoesNotMatch"):
        storage.write_text(f"{s3_bucket}/secret/other.txt", "x")
    with pytest.raises(AccessDeniedError):
        storage.list_files(f"{s3_bucket}/secret")
    src = tmp_path / "up"
    src.mkdir()
    (src / "f.txt").write_text("f")
    with pytest.raises(AccessDeniedError, match=r"f\.txt"):
        storage.upload_dir(src, f"{s3_bucket}/up")

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unknown-key")
    with pytest.raises(AccessDeniedError):
        storage.exists(uri)


def test_missing_bucket_is_named(s3_env: object) -> None:
    uri = "s3://no-such-bucket-4f2a/x/y.json"
    with pytest.raises(NotFoundError, match="bucket 'no-such-bucket-4f2a' does not exist"):
        storage.read_json(uri)
    with pytest.raises(NotFoundError, match="no-such-bucket-4f2a"):
        storage.exists(uri)
    with pytest.raises(NotFoundError, match="no-such-bucket-4f2a"):
        storage.list_files("s3://no-such-bucket-4f2a/x")


def test_unreachable_endpoint_is_a_storage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from servers import free_ports

    port = free_ports(1)[0]  # nothing listens there
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.setenv(key, f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    with pytest.raises(StorageError, match=f"cannot reach S3 at http://127.0.0.1:{port}"):
        storage.read_bytes("s3://bucket/key")


# --------------------------------------------------------------------------- hostile object keys


def test_download_keeps_keys_seaweedfs_accepts_inside_the_folder(s3_bucket: str, tmp_path: Path) -> None:
    """Issue 23: ``download_dir`` joined keys unchecked. The hostile keys a real SeaweedFS stores
    (``model//abs/path``: it folds the double slash; ``%2e%2e`` is a literal name) land inside."""
    bucket, _ = storage.split_s3(s3_bucket)
    client = storage._s3()
    outside = tmp_path / "outside"
    for key in (f"model/{outside}/planted.txt", "model/%2e%2e/enc.txt", "model/ok.txt"):
        client.put_object(Bucket=bucket, Key=key.replace("model/", "model//", 1), Body=b"x")
    dst = tmp_path / "dst"
    storage.download_dir(f"{s3_bucket}/model", dst)
    assert not outside.exists()
    assert sorted(_read_tree(dst)) == sorted(["%2e%2e/enc.txt", "ok.txt", f"{outside}/planted.txt"[1:]])


class _LyingS3:
    """An S3 endpoint (ListObjectsV2, HeadObject, GetObject) whose listing holds keys as AWS S3
    stores them but SeaweedFS refuses to (``..`` and ``.`` segments, a leading ``/``)."""

    def __init__(self, keys: list[str]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from xml.sax.saxutils import escape

        self.fetched: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def _object(self, body: bool) -> None:
                from urllib.parse import unquote, urlsplit

                server.fetched.append(unquote(urlsplit(self.path).path))
                self.send_response(200)
                self.send_header("Content-Length", "5")
                self.send_header("ETag", '"e"')
                self.send_header("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")
                self.end_headers()
                if body:
                    self.wfile.write(b"owned")

            def do_HEAD(self) -> None:
                self._object(False)

            def do_GET(self) -> None:
                if "list-type=2" not in self.path:
                    return self._object(True)
                items = "".join(
                    f'<Contents><Key>{escape(k)}</Key><Size>5</Size><ETag>"e"</ETag>'
                    "<LastModified>2024-01-01T00:00:00.000Z</LastModified><StorageClass>STANDARD</StorageClass>"
                    "</Contents>"
                    for k in keys
                )
                xml = (
                    '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
                    'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>model/</Prefix>'
                    f"<KeyCount>{len(keys)}</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
                    f"{items}</ListBucketResult>"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(xml)))
                self.end_headers()
                self.wfile.write(xml)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.mark.parametrize(
    "hostile",
    [
        "model/../escaped.txt",
        "model/a/../../escaped.txt",
        "model//ABS/escaped.txt",
        "model/./x.txt",
        "model/a\\..\\..\\escaped.txt",
        "model/a/",
    ],
)
def test_download_refuses_keys_that_leave_the_folder(
    hostile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dst = outside / "dst"
    key = hostile.replace("ABS", str(outside).lstrip("/"))
    s3 = _LyingS3(["model/fine.txt", key, "model/later.txt"])
    try:
        for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.setenv(var, s3.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        if hostile.endswith("/"):  # a "folder marker" is skipped, not written: the rest downloads
            storage.download_dir("s3://b/model", dst)
            assert sorted(_read_tree(dst)) == ["fine.txt", "later.txt"]
            return
        with pytest.raises(StorageError, match="refusing object key"):
            storage.download_dir("s3://b/model", dst)
    finally:
        s3.httpd.shutdown()
        s3.httpd.server_close()
    assert s3.fetched == []  # every key is checked before anything is fetched
    assert sorted(p.name for p in outside.rglob("*")) == []


def test_s3_data_folders_left_by_killed_runs_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    """A killed test run left its SeaweedFS folder in /tmp (its cleanup never ran); the next
    server start removes every such folder whose processes are all gone, and no other."""
    import subprocess
    import sys
    import time

    from servers import S3_DIR_PREFIX, remove_stale_s3_dirs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folders = {name: tmp_path / f"{S3_DIR_PREFIX}{name}" for name in ("dead", "live", "mixed", "old", "new")}
    for folder in folders.values():
        (folder / "data-0").mkdir(parents=True)
    (folders["dead"] / "pids").write_text(f"{gone.pid}\n")
    (folders["live"] / "pids").write_text(f"{os.getpid()}\n")
    (folders["mixed"] / "pids").write_text(f"{gone.pid}\n{os.getpid()}\n")  # the weed process lives on
    week_ago = time.time() - 7 * 86400
    os.utime(folders["old"], (week_ago, week_ago))  # no pids file: written before it existed
    (tmp_path / "unrelated").mkdir()
    removed = remove_stale_s3_dirs(tmp_path)
    assert sorted(p.name for p in removed) == [f"{S3_DIR_PREFIX}dead", f"{S3_DIR_PREFIX}old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{S3_DIR_PREFIX}live", f"{S3_DIR_PREFIX}mixed", f"{S3_DIR_PREFIX}new", "unrelated"]
    )


def test_the_sessions_s3_server_names_its_processes_in_its_data_folder(s3_server: object) -> None:
    import tempfile

    from servers import S3_DIR_PREFIX, _alive

    mine = [
        f
        for f in Path(tempfile.gettempdir()).glob(S3_DIR_PREFIX + "*")
        if (f / "pids").is_file() and (f / "pids").read_text().split()[0] == str(os.getpid())
    ]
    assert len(mine) == 1
    pids = [int(p) for p in (mine[0] / "pids").read_text().split()]
    assert len(pids) >= 2 and _alive(pids[-1])  # this process, then the weed process that serves
