"""The whole ``conductor-training`` pipeline on kfp's local runner, its CLI, the compiled YAML, the images.

One quick run (a handful of training steps on a small sample) is shared by the module. It goes
through ``conductor pipeline run --local --quick``, as ``make run`` does, against a registry that
already holds a champion: a stand-in for an earlier run's version (a placeholder folder with poor
metrics on the same test split). The quick run's Conductor is deliberately weak (two GRPO
steps), so the gate registers it and refuses it: it is below the best single worker /
domain-router of its own evaluation, whatever the champion scored. Everything lives in a
temporary CONDUCTOR_HOME (sqlite MLflow, artifact root, kfp root).
"""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from typer.testing import CliRunner

from _home import isolate_home
from _lazy import lazy
from rl_conductor.cli import app
from rl_conductor.pipeline import runner, steps
from rl_conductor.pipeline.runner import QUICK_ARGUMENTS, pipeline_arguments, repo_root
from rl_conductor.tasks.datasets import load_tasks

# imported by the first test that uses them (tests/_lazy.py): MLflow takes seconds to import
mlflow_utils = lazy("rl_conductor.tracking.mlflow_utils")
registry = lazy("rl_conductor.tracking.registry")

ROOT = repo_root()
SRC = ROOT / "src"
sys.path.insert(0, str(ROOT))

from components import images  # noqa: E402


@dataclass
class Quick:
    home: Path
    output: str
    seconds: float
    split_id: str


def _seed_previous_champion(work: Path, split_id: str) -> None:
    """Register and promote a placeholder version that scored 0 % at $1 per task on ``split_id``."""
    folder = work / "previous-model"
    folder.mkdir(parents=True)
    (folder / "conductor.json").write_text(json.dumps({"base_model": "tiny", "reward_preset": "paper"}))
    baseline = {"baseline_policy": "single:stand-in", "baseline_accuracy": 0.0, "baseline_mean_cost_usd": 1.0}
    row = {
        "policy": "conductor",
        "n": QUICK_ARGUMENTS["eval_limit"],
        "accuracy": 0.0,
        "mean_cost_usd": 1.0,
        **baseline,
    }
    results = work / "previous-results.json"
    meta = {"test_split_id": split_id, "pool": "paper-sim", "best_baseline": baseline}
    results.write_text(json.dumps({"meta": meta, "results": [row]}))
    version = steps.register_step(model_dir=folder, results_path=results, run_tag="previous").version
    assert steps.promote_step(version=version).champion == version == 1


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quick]:
    home = tmp_path_factory.mktemp("pipeline-home")
    tests = load_tasks("paper-mix", "test", limit=QUICK_ARGUMENTS["eval_limit"], seed=0)
    split_id = steps.test_split_id(tests, "paper-sim")
    with pytest.MonkeyPatch.context() as mp:
        isolate_home(mp, home)
        _seed_previous_champion(tmp_path_factory.mktemp("previous"), split_id)
        t0 = time.perf_counter()
        result = CliRunner().invoke(app, ["pipeline", "run", "--local", "--quick", "--preset", "tiny"])
        seconds = time.perf_counter() - t0
        assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
        yield Quick(home=home, output=result.output, seconds=seconds, split_id=split_id)


@pytest.fixture
def quick_env(quick: Quick, monkeypatch: pytest.MonkeyPatch) -> Quick:
    isolate_home(monkeypatch, quick.home)
    mlflow_utils.configure()
    return quick


@pytest.mark.slow
def test_quick_run_prints_table_report_version_and_aliases(quick: Quick) -> None:
    out = quick.output
    for policy in ("conductor", "knn", "domain-router", "moa", "oracle", "single:gpt-5"):
        assert f"{policy} " in out, policy
    # better than the champion (0 %) but below a fixed router of the same evaluation: refused
    assert "registered: conductor version 2 (aliases: challenger)" in out
    assert "gate: not promoted:" in out and "on the same test questions" in out
    report = re.search(r"report: (\S+)", out)
    assert report is not None
    relative = Path(report.group(1)).relative_to(quick.home / ".conductor" / "artifacts")
    assert relative.parts[0].startswith("conductor-training-") and relative.parts[1:] == (
        "reports",
        "report.md",
    )


@pytest.mark.slow
def test_quick_run_fills_the_artifact_root(quick: Quick) -> None:
    (folder,) = (quick.home / ".conductor" / "artifacts").iterdir()
    assert sorted(p.name for p in (folder / "data").iterdir()) == [
        "test.jsonl",
        "train.jsonl",
        "validation.jsonl",
    ]
    assert (folder / "checkpoints" / "final" / "model.safetensors").is_file()
    assert (folder / "checkpoints" / "metrics.json").is_file()
    meta, summaries = steps.read_results(folder / "reports" / "results.json")
    assert meta["test_split_id"] == quick.split_id
    assert [s["policy"] for s in summaries][-2:] == ["oracle", "conductor"] and len(summaries) == 14
    assert {"domain-router", "knn"} <= {s["policy"] for s in summaries}
    assert all(s["n"] == QUICK_ARGUMENTS["eval_limit"] for s in summaries)
    best = meta["best_baseline"]
    # every policy scored at the Conductor's own reward; the gate's baseline is the best at it
    assert meta["reward"] and all(s["reward"] == meta["reward"] for s in summaries)
    gates = [s for s in summaries if s["policy"].startswith(("single:", "domain-router", "knn"))]
    assert best["baseline_mean_reward"] == max(s["mean_reward"] for s in gates)
    assert summaries[-1]["baseline_policy"] == best["baseline_policy"]
    payload = json.loads((folder / "reports" / "results.json").read_text())
    budgeted = {s["policy"]: s for s in payload["budget_results"]}
    assert budgeted["conductor"]["budget"] == "0.002" and "domain-router" in budgeted
    report = (folder / "reports" / "report.md").read_text()
    assert "## What each policy does" in report and "## Under a budget" in report
    assert "acc % @0.002" in report and "workflow shapes" in report
    assert (folder / "reports" / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    deadlined = {s["policy"]: s for s in payload["deadline_results"]}  # issue 13: latency view
    assert deadlined["conductor"]["deadline"] == "5" and "domain-router" in deadlined
    assert "## Under a deadline" in report and "acc % @5" in report
    assert (folder / "reports" / "latency.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_gate_compared_with_the_existing_champion(quick_env: Quick) -> None:
    rows = {r.version: r for r in registry.list_versions("conductor")}
    assert set(rows) == {1, 2}
    assert rows[2].tags["gate.champion_before"] == "1" and rows[2].tags["gate.promoted"] == "false"
    assert "stays registered but not champion" in rows[2].tags["gate.reason"]
    assert registry.get_alias_version("conductor", "champion") == 1
    assert rows[1].test_split_id == rows[2].test_split_id == quick_env.split_id
    assert rows[2].metrics["n"] == QUICK_ARGUMENTS["eval_limit"]
    assert rows[2].metrics["mean_reward"] < rows[2].metrics["baseline_mean_reward"]
    assert rows[2].tags["pipeline.run_tag"].startswith("conductor-training-")


@pytest.mark.slow
def test_registered_version_loads_in_a_fresh_process(quick_env: Quick) -> None:
    script = textwrap.dedent(
        """
        import json, pathlib
        import mlflow.pyfunc
        from rl_conductor.tracking import mlflow_utils, registry
        mlflow_utils.configure()
        folder = pathlib.Path(registry.load_model_dir("models:/conductor@challenger"))
        model = mlflow.pyfunc.load_model("models:/conductor@challenger")
        from rl_conductor.policies.conductor import ConductorPolicy
        policy = ConductorPolicy(folder)
        print(json.dumps({"files": sorted(p.name for p in folder.iterdir()), "pyfunc": type(model).__name__}))
        """
    )
    env = {"PYTHONPATH": str(SRC), "CONDUCTOR_HOME": str(quick_env.home), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"conductor.json", "model.safetensors", "tokenizer.json", "prompts"} <= set(loaded["files"])
    assert loaded["pyfunc"] == "PyFuncModel"


@pytest.mark.slow
def test_registry_cli_lists_and_promotes_by_hand(quick_env: Quick) -> None:
    cli = CliRunner()
    listed = cli.invoke(app, ["registry", "list"])
    assert listed.exit_code == 0, listed.output
    assert "challenger" in listed.output and "champion" in listed.output
    promoted = cli.invoke(app, ["registry", "promote", "--version", "2"])  # a person overrides the gate
    assert promoted.exit_code == 0, promoted.output
    assert "conductor@champion was: v1" in promoted.output
    assert "conductor@champion now: v2 [challenger, champion]" in promoted.output
    assert registry.get_alias_version("conductor", "champion") == 2
    assert cli.invoke(app, ["registry", "promote", "--version", "1"]).exit_code == 0  # put it back
    missing = cli.invoke(app, ["registry", "promote", "--version", "99"])
    assert missing.exit_code != 0 and "no version 99" in missing.output


# --------------------------------------------------------------------------- no run needed


def test_compiled_yaml_is_not_stale(tmp_path: Path) -> None:
    fresh = runner.compile_pipeline(tmp_path / "fresh.yaml")
    committed = runner.default_package_path()
    assert committed.is_file(), (
        "run `conductor pipeline compile` and commit pipelines/conductor_training.yaml"
    )
    assert fresh.read_text() == committed.read_text(), "stale: run `conductor pipeline compile`"


def test_loading_a_pipeline_leaves_sys_path_alone(tmp_path: Path) -> None:
    """The installed library loads the checkout's ``pipelines/`` and ``components/`` by path (a
    fresh process outside the checkout: the package finds it from its own file)."""
    code = textwrap.dedent(
        """
        import sys
        from rl_conductor.loop import pipeline as loop_pipeline
        from rl_conductor.pipeline import runner
        before = list(sys.path)
        training, retrain = runner.load_pipeline(), loop_pipeline.load_pipeline()
        print(sys.path == before, sys.modules["components"].__file__, sys.modules["pipelines"].__file__)
        print(training.name, retrain.name)
        """
    )
    run = [sys.executable, "-c", code]
    out = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    same, components, pipelines = out.stdout.splitlines()[0].split()
    assert same == "True"
    assert Path(components) == ROOT / "components" / "__init__.py"
    assert Path(pipelines) == ROOT / "pipelines" / "__init__.py"
    assert out.stdout.splitlines()[1].split() == ["conductor-training", "conductor-retrain"]


def _compiled() -> tuple[dict[str, Any], dict[str, Any]]:
    """The committed YAML's two documents: the pipeline spec and the Kubernetes platform spec."""
    spec, platform = yaml.safe_load_all(runner.default_package_path().read_text())
    return spec, platform


def _yaml_images(spec: dict[str, Any]) -> dict[str, str]:
    executors = spec["deploymentSpec"]["executors"]
    return {name: body["container"]["image"] for name, body in executors.items()}


def test_images_agree_between_yaml_dockerfiles_and_constants() -> None:
    spec, _ = _compiled()
    used = _yaml_images(spec)
    assert used["exec-train-conductor"] == images.CUDA_IMAGE
    assert {v for k, v in used.items() if k != "exec-train-conductor"} == {images.BASE_IMAGE}
    label = re.compile(rf'^LABEL {re.escape(images.IMAGE_LABEL)}="([^"]+)"$', re.MULTILINE)
    built = {}
    for name in ("Dockerfile", "Dockerfile.cuda"):
        found = label.findall((ROOT / "docker" / name).read_text())
        assert len(found) == 1, f"docker/{name} needs one {images.IMAGE_LABEL} label"
        built[name] = found[0]
    assert built == {"Dockerfile": images.BASE_IMAGE, "Dockerfile.cuda": images.CUDA_IMAGE}
    from rl_conductor import __version__

    assert __version__ == images.VERSION


def test_the_evaluation_step_runs_torch_on_the_threads_the_conductor_trained_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from rl_conductor.evaluation import suite

    seen: list[int] = []

    def sweep(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        seen.append(torch.get_num_threads())
        raise RuntimeError("stop here")

    monkeypatch.setattr(suite, "run_sweep", sweep)
    paths = {s: tmp_path / f"{s}.jsonl" for s in ("train", "test")}
    for split, path in paths.items():
        steps.write_tasks(path, load_tasks("paper-mix", split, limit=4, seed=0))
    model = tmp_path / "model"
    model.mkdir()
    before = torch.get_num_threads()
    for trained, want in ((2, 2), (1, 1), (None, before)):
        config = {} if trained is None else {"train_config": {"torch_threads": trained}}
        (model / "conductor.json").write_text(json.dumps(config))
        outputs = {k: str(tmp_path / k) for k in ("report_md", "report_html", "pareto_png", "results_json")}
        with pytest.raises(RuntimeError, match="stop here"):
            steps.evaluate_step(
                model_dir=model, train_path=paths["train"], test_path=paths["test"], outputs=outputs
            )
        assert seen[-1] == want and torch.get_num_threads() == before


def test_compiled_yaml_asks_for_a_gpu_and_secrets_only_where_needed() -> None:
    spec, platform = _compiled()
    train = spec["deploymentSpec"]["executors"]["exec-train-conductor"]["container"]
    assert train["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    # the GPU count is the train_gpus parameter (default 1), one training process per GPU
    assert (
        train["resources"]["accelerator"]["resourceCount"]
        == "{{$.inputs.parameters['pipelinechannel--train_gpus']}}"
    )
    assert spec["root"]["inputDefinitions"]["parameters"]["train_gpus"]["defaultValue"] == 1
    others = [b for k, b in spec["deploymentSpec"]["executors"].items() if k != "exec-train-conductor"]
    assert all("resources" not in b["container"] for b in others)
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]

    def secret_envs(executor: str) -> set[str]:
        return {m["envVar"] for s in k8s[executor]["secretAsEnv"] for m in s["keyToEnv"]}

    assert {"OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY"} <= secret_envs("exec-train-conductor")
    assert "OPENAI_API_KEY" not in secret_envs("exec-promote-conductor")


def test_pipeline_arguments_quick_and_validation() -> None:
    args = pipeline_arguments(quick=True, eval_limit=5, train_overrides={"num_generations": 4}, pool=None)
    assert args["eval_limit"] == 5 and args["grpo_steps"] == runner.QUICK_ARGUMENTS["grpo_steps"]
    assert json.loads(args["train_overrides"]) == {"num_generations": 4} and "pool" not in args
    with pytest.raises(ValueError, match="unknown pipeline parameters"):
        pipeline_arguments(gpu_count=2)


def test_submit_refuses_local_storage_for_a_cluster() -> None:
    with pytest.raises(ValueError, match="artifact_root=s3://"):
        runner.submit("http://127.0.0.1:9", mlflow_tracking_uri="http://mlflow:5000")
    with pytest.raises(ValueError, match="mlflow_tracking_uri"):
        runner.submit("http://127.0.0.1:9", artifact_root="s3://bucket/conductor")


class _KfpApiStandIn(http.server.BaseHTTPRequestHandler):
    """The few KFP v2beta1 endpoints ``kfp.Client`` calls to start a run (no API server runs here)."""

    created_runs: ClassVar[list[dict[str, Any]]] = []

    def _reply(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.startswith("/apis/v2beta1/healthz"):
            self._reply({"multi_user": False})
        elif self.path.startswith("/apis/v2beta1/experiments"):
            self._reply({"experiments": [], "total_size": 0})
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if self.path == "/apis/v2beta1/experiments":
            self._reply({"experiment_id": "exp-1", "display_name": body.get("display_name", "")})
        elif self.path == "/apis/v2beta1/runs":
            type(self).created_runs.append(body)
            self._reply({"run_id": "run-1", "display_name": body.get("display_name", ""), "state": "PENDING"})
        else:
            self.send_error(404)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_submit_sends_the_compiled_pipeline_and_its_arguments() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KfpApiStandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        run_id = runner.submit(
            f"http://127.0.0.1:{server.server_address[1]}",
            artifact_root="s3://bucket/conductor",
            mlflow_tracking_uri="http://mlflow.mlops:5000",
            preset="gpu",
            run_name="nightly",
        )
    finally:
        server.shutdown()
        server.server_close()
    assert run_id == "run-1"
    (body,) = _KfpApiStandIn.created_runs
    assert body["display_name"] == "nightly" and body["experiment_id"] == "exp-1"
    assert body["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "conductor-training"
    assert "kubernetes" in body["pipeline_spec"]["platform_spec"]["platforms"]
    assert body["runtime_config"]["parameters"] == {
        "artifact_root": "s3://bucket/conductor",
        "mlflow_tracking_uri": "http://mlflow.mlops:5000",
        "preset": "gpu",
    }


def test_the_registry_records_the_preset_a_list_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H24: a pipeline run with ``preset: auto`` registered its model with ``preset=auto``; the
    registry records the chosen preset and keeps the list as ``preset_candidates``."""
    import mlflow

    isolate_home(monkeypatch, tmp_path)
    mlflow_utils.configure()
    folder = tmp_path / "model"
    folder.mkdir()
    choice = {"chosen": "recordings", "preset": "recordings", "split": "validation"}
    (folder / "conductor.json").write_text(json.dumps({"base_model": "tiny", "preset_choice": choice}))
    row = {"policy": "conductor", "n": 3, "accuracy": 0.5, "mean_cost_usd": 0.01}
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"meta": {"test_split_id": "x", "pool": "p"}, "results": [row]}))
    done = steps.register_step(model_dir=folder, results_path=results, params={"preset": "auto"}, run_tag="t")
    params = mlflow.get_run(done.run_id).data.params
    assert params["preset"] == "recordings" and params["preset_candidates"] == "auto"
