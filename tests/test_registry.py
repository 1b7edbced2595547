"""registry: log the Conductor folder as a pyfunc model, alias it, fetch it back.

MLflow runs against a sqlite store with artifacts on the real S3 server (SeaweedFS); one test
goes through a real ``mlflow server`` process that proxies artifacts to S3.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from _lazy import lazy
from rl_conductor import storage
from servers import MlflowServer, S3Server

if TYPE_CHECKING:
    from rl_conductor.tracking.mlflow_utils import TrackingConfig

# imported by the first test that uses them (tests/_lazy.py): MLflow takes seconds to import
mlflow = lazy("mlflow")
pd = lazy("pandas")
mlflow_utils = lazy("rl_conductor.tracking.mlflow_utils")
registry = lazy("rl_conductor.tracking.registry")
pyfunc = lazy("rl_conductor.serving.pyfunc")  # the "models from code" file the registry logs

SRC = Path(__file__).resolve().parents[1] / "src"


def _model_folder(root: Path) -> Path:
    folder = root / "conductor-model"
    files = {
        "config.json": json.dumps({"model_type": "qwen2", "hidden_size": 64}),
        "model.safetensors": os.urandom(50_000),
        "tokenizer/tokenizer.json": json.dumps({"model": {"type": "BPE"}}),
        "prompt_template.txt": "You are the Conductor. {question}\n",
    }
    for rel, content in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (folder / rel).write_bytes(content)
        else:
            (folder / rel).write_text(content)
    return folder


def _digest(folder: Path | str) -> dict[str, str]:
    root = Path(folder)
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _last_json_line(script: str, args: list[str], env: dict[str, str]) -> Any:
    """Run ``script`` in a fresh Python with ``args`` and ``env``; the JSON of its last stdout line."""
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_log_register_alias_promote(
    mlflow_tracking: TrackingConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _model_folder(tmp_path)
    report = tmp_path / "report.json"
    report.write_text('{"accuracy": 0.61}')
    name, experiment = _unique("conductor"), _unique("exp")

    v1 = registry.log_conductor_model(
        folder,
        model_code=pyfunc.MODEL_CODE,
        name=name,
        experiment=experiment,
        metrics={"accuracy": 0.61, "mean_cost_usd": 0.012, "skipped": float("nan")},
        params={"test_split_id": "split-a", "train": {"lr": 1e-4, "steps": 40}},
        artifact_files={"eval/report.json": report},
    )
    assert (v1.version, v1.aliases, v1.model_uri) == (1, ("challenger",), f"models:/{name}/1")
    assert registry.get_alias_version(name, "challenger") == 1
    assert registry.get_alias_version(name, "champion") is None
    assert registry.get_alias_version("no-such-model", "champion") is None

    run = mlflow_utils.client().get_run(v1.run_id)
    assert run.data.params["train.lr"] == "0.0001" and run.data.tags["test_split_id"] == "split-a"
    assert "skipped" not in run.data.metrics

    # Artifacts really live in the S3 bucket: the run's report and the model folder inside the model.
    exp_root = f"{mlflow_tracking.artifact_root}/{experiment}"
    files = storage.sizes(exp_root)
    assert f"{v1.run_id}/artifacts/eval/report.json" in files
    weights = [k for k in files if k.endswith("artifacts/conductor-model/model.safetensors")]
    assert len(weights) == 1 and files[weights[0]] == 50_000

    assert registry.promote(name, v1.version) is None
    v2 = registry.log_conductor_model(
        folder,
        model_code=pyfunc.MODEL_CODE,
        name=name,
        experiment=experiment,
        metrics={"accuracy": 0.7, "mean_cost_usd": 0.01},
    )
    assert v2.version == 2
    assert registry.get_alias_version(name, "challenger") == 2
    assert registry.promote(name, 2) == 1

    rows = registry.list_versions(name)
    assert [(r.version, r.aliases) for r in rows] == [(1, []), (2, ["challenger", "champion"])]
    assert rows[0].metrics == {"accuracy": 0.61, "mean_cost_usd": 0.012}
    assert rows[0].test_split_id == "split-a" and rows[1].test_split_id is None
    assert rows[0].created <= rows[1].created
    assert registry.version_metrics(name, 1)["test_split_id"] == "split-a"
    assert registry.list_versions("no-such-model") == []

    # The pyfunc flavour loads ("models from code") and its context points at the folder.
    loaded = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    model_dir = loaded.unwrap_python_model().model_dir
    assert _digest(model_dir) == _digest(folder)

    # predict hands the folder and the requests as records to serving.pyfunc.answer_batch;
    # a recording stand-in replaces it (answering is not part of this test).
    calls: list[tuple[str, list[dict[str, object]]]] = []

    def answer_batch(folder_path: str, inputs: list[dict[str, object]]) -> list[dict[str, str]]:
        calls.append((folder_path, inputs))
        return [{"answer": "2"} for _ in inputs]

    monkeypatch.setattr("rl_conductor.serving.pyfunc.answer_batch", answer_batch)
    assert loaded.predict(pd.DataFrame([{"question": "1+1?", "max_cost_usd": 0.01}])) == [{"answer": "2"}]
    assert loaded.predict([{"question": "2+0?"}, {"question": "3-1?"}]) == [{"answer": "2"}] * 2
    assert calls[0] == (model_dir, [{"question": "1+1?", "max_cost_usd": 0.01}])
    assert [len(inputs) for _, inputs in calls] == [1, 2]


def test_log_inside_active_run(mlflow_tracking: TrackingConfig, tmp_path: Path) -> None:
    folder = _model_folder(tmp_path)
    name = _unique("conductor")
    with mlflow_utils.start_run(_unique("exp"), "train-and-register", {"preset": "tiny"}) as run:
        mlflow_utils.log_metrics({"reward": 0.4, "ok": True}, step=3)
        info = registry.log_conductor_model(
            folder, model_code=pyfunc.MODEL_CODE, name=name, metrics={"accuracy": 0.5}
        )
        assert info.run_id == run.info.run_id
    data = mlflow_utils.client().get_run(info.run_id).data
    assert data.params["preset"] == "tiny"
    assert data.metrics == {"reward": 0.4, "ok": 1.0, "accuracy": 0.5}


def test_fresh_process_downloads_challenger(mlflow_tracking: TrackingConfig, tmp_path: Path) -> None:
    folder = _model_folder(tmp_path)
    name = _unique("conductor")
    registry.log_conductor_model(folder, model_code=pyfunc.MODEL_CODE, name=name, metrics={"accuracy": 0.5})

    script = (
        "import hashlib, json, pathlib, sys\n"
        "from rl_conductor.tracking.registry import load_model_dir\n"
        "d = pathlib.Path(load_model_dir(sys.argv[1], sys.argv[2]))\n"
        "print(json.dumps({p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()"
        " for p in sorted(d.rglob('*')) if p.is_file()}))\n"
    )
    env = {
        **os.environ,  # carries the S3 endpoint and credentials set by the fixture
        "MLFLOW_TRACKING_URI": mlflow_tracking.tracking_uri,
        "PYTHONPATH": str(SRC),
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }
    downloaded = _last_json_line(script, [f"models:/{name}@challenger", str(tmp_path / "dl")], env)
    assert downloaded == _digest(folder)


def test_a_download_without_dst_is_removed_when_the_process_exits(s3_bucket: str, tmp_path: Path) -> None:
    """A server or CLI command that loads ``models:/…`` or ``s3://…`` without ``dst`` leaves no
    ``conductor-model-*`` copy in the temp folder after it exits."""
    folder = _model_folder(tmp_path)
    storage.upload_dir(folder, f"{s3_bucket}/models/v1")
    script = (
        "import json, pathlib, sys\n"
        "from rl_conductor.tracking.registry import load_model_dir\n"
        "d = pathlib.Path(load_model_dir(sys.argv[1]))\n"
        "print(json.dumps({'dir': str(d), 'files': sum(p.is_file() for p in d.rglob('*'))}))\n"
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": str(temp)}  # S3 settings from the fixture
    out = _last_json_line(script, [f"{s3_bucket}/models/v1"], env)
    assert out["files"] == len(_digest(folder)) > 0
    assert Path(out["dir"]).parent == temp and Path(out["dir"]).name.startswith("conductor-model-")
    assert list(temp.iterdir()) == []


def test_load_model_dir_from_plain_locations(s3_bucket: str, tmp_path: Path) -> None:
    folder = _model_folder(tmp_path)
    assert registry.load_model_dir(str(folder)) == str(folder)
    storage.upload_dir(folder, f"{s3_bucket}/models/v1")
    local = registry.load_model_dir(f"{s3_bucket}/models/v1", tmp_path / "from-s3")
    assert _digest(local) == _digest(folder)
    with pytest.raises(FileNotFoundError):
        registry.load_model_dir(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        registry.log_conductor_model(tmp_path / "missing", model_code=pyfunc.MODEL_CODE, metrics={})


@pytest.mark.slow
def test_through_mlflow_server(
    mlflow_server_s3: MlflowServer, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client holds no S3 credentials: the server proxies artifacts to the bucket.
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    previous = mlflow.get_tracking_uri()
    try:
        cfg = mlflow_utils.configure(mlflow_server_s3.url)
        assert cfg.artifact_root is None  # the server decides where artifacts go
        folder = _model_folder(tmp_path)
        name = _unique("conductor")
        info = registry.log_conductor_model(
            folder,
            model_code=pyfunc.MODEL_CODE,
            name=name,
            metrics={"accuracy": 0.66, "mean_cost_usd": 0.02},
            params={"test_split_id": "s"},
        )
        assert registry.promote(name, info.version) is None
        assert registry.get_alias_version(name, "champion") == info.version
        local = registry.load_model_dir(f"models:/{name}@champion", tmp_path / "dl")
        assert _digest(local) == _digest(folder)
        assert registry.version_metrics(name, info.version) == {
            "accuracy": 0.66,
            "mean_cost_usd": 0.02,
            "test_split_id": "s",
        }
    finally:
        mlflow_utils.reset()
        mlflow.set_tracking_uri(previous)
        mlflow.set_registry_uri(previous)

    bucket, prefix = mlflow_server_s3.artifacts_destination[len("s3://") :].split("/", 1)
    keys = [
        o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    ]
    assert any(k.endswith("conductor-model/model.safetensors") for k in keys)


def test_default_locations_follow_conductor_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", mlflow_utils.ARTIFACT_ROOT_ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(mlflow_utils.HOME_ENV, str(tmp_path))
    previous = mlflow.get_tracking_uri()
    try:
        cfg = mlflow_utils.configure()
        assert cfg.tracking_uri == f"sqlite:///{tmp_path.resolve()}/.conductor/mlflow.db"
        assert cfg.registry_uri == cfg.tracking_uri
        assert cfg.artifact_root == str(tmp_path.resolve() / ".conductor" / "mlruns")
        assert (tmp_path / ".conductor").is_dir() and mlflow.get_tracking_uri() == cfg.tracking_uri

        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
        server_cfg = mlflow_utils.configure()
        assert (server_cfg.tracking_uri, server_cfg.artifact_root) == ("http://127.0.0.1:5000", None)
        explicit = mlflow_utils.configure("sqlite:///x.db", "sqlite:///r.db", artifact_root="s3://b/p")
        assert (explicit.registry_uri, explicit.artifact_root) == ("sqlite:///r.db", "s3://b/p")
    finally:
        mlflow_utils.reset()
        mlflow.set_tracking_uri(previous)
        mlflow.set_registry_uri(previous)
    assert mlflow_utils.flatten_params({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {
        "a.b": "1",
        "a.c": "[1, 2]",
        "d": "",
    }


@pytest.mark.slow
def test_processes_started_together_on_a_fresh_home_share_one_store(tmp_path: Path) -> None:
    """Four processes (say predictor replicas) open the default sqlite store of one fresh
    CONDUCTOR_HOME at once: MLflow migrates a new file on first touch, and without the lock beside
    it all but one failed with "duplicate column name" (CI, four test workers)."""
    code = (
        "from rl_conductor.tracking import mlflow_utils as m; m.configure(); "
        "print(m.ensure_experiment('shared'))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env[mlflow_utils.HOME_ENV] = str(tmp_path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err.decode()[-1500:] for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 1  # one experiment, the same id everywhere
