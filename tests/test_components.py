"""The KFP components, each through ``.python_func(...)`` and through kfp's local runner.

One quick chain (prepare → train → evaluate → register → promote, the ``--quick`` sizes) runs
through ``.python_func`` with its artifact root and MLflow artifacts on a real S3 server
(SeaweedFS on loopback) and MLflow on a temporary sqlite file. On kfp's local runner,
``prepare_data`` and ``promote_conductor`` run alone and ``register_conductor`` inside a small
pipeline that imports the chain's artifacts (the local runner refuses artifact inputs to a lone
component); ``train_conductor`` and ``evaluate_conductor`` run on it in ``test_pipeline.py``'s
whole-pipeline run, so the suite trains and evaluates twice, not three times.

No ``from __future__ import annotations`` here: kfp reads the test pipeline's annotations as
types, not strings.
"""

import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl

from _home import isolate_home
from _lazy import lazy
from rl_conductor import storage
from rl_conductor.pipeline import steps
from rl_conductor.pipeline.runner import QUICK_ARGUMENTS, local_session, repo_root
from rl_conductor.tasks.datasets import split_of
from servers import S3Server

sys.path.insert(0, str(repo_root()))

from components.evaluate_conductor.component import evaluate_conductor
from components.prepare_data.component import prepare_data
from components.promote_conductor.component import promote_conductor
from components.register_conductor.component import register_conductor
from components.train_conductor.component import train_conductor

# imported by the first test that uses them (tests/_lazy.py): MLflow takes seconds to import
mlflow_utils = lazy("rl_conductor.tracking.mlflow_utils")
registry = lazy("rl_conductor.tracking.registry")

TRAIN_LIMIT = QUICK_ARGUMENTS["train_limit"]
EVAL_LIMIT = QUICK_ARGUMENTS["eval_limit"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class Chain:
    """Artifacts and outputs of the ``.python_func`` chain."""

    home: Path
    root: str
    work: Path
    prepared: Any
    data: dict[str, dsl.Dataset]
    stats: dsl.Metrics
    model: dsl.Model
    train_metrics: dsl.Metrics
    train_out: Any
    eval_metrics: dsl.Metrics
    eval_outputs: dict[str, dsl.Artifact]
    eval_out: Any
    register_out: Any
    promote_out: Any


def _artifact(cls: type[dsl.Artifact], path: Path) -> Any:
    return cls(name=path.name, uri=str(path), metadata={})


@pytest.fixture(scope="module")
def chain(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    home = tmp_path_factory.mktemp("components-home")
    work = tmp_path_factory.mktemp("components-artifacts")
    with pytest.MonkeyPatch.context() as mp:
        isolate_home(mp, home)
        for key, value in s3_server.env().items():
            mp.setenv(key, value)
        bucket = s3_server.create_bucket(f"components-{uuid.uuid4().hex[:10]}")
        root = f"{bucket}/conductor"
        data = {s: _artifact(dsl.Dataset, work / f"{s}_data") for s in steps.DATA_SPLITS}
        stats = _artifact(dsl.Metrics, work / "data_stats")
        prepared = prepare_data.python_func(
            train_data=data["train"],
            validation_data=data["validation"],
            test_data=data["test"],
            data_stats=stats,
            train_limit=TRAIN_LIMIT,
            eval_limit=EVAL_LIMIT,
            artifact_root=root,
            run_tag="chain",
        )
        model = _artifact(dsl.Model, work / "model")
        train_metrics = _artifact(dsl.Metrics, work / "train_metrics")
        train_out = train_conductor.python_func(
            train_data=data["train"],
            validation_data=data["validation"],
            model=model,
            train_metrics=train_metrics,
            grpo_steps=QUICK_ARGUMENTS["grpo_steps"],
            sft_examples=QUICK_ARGUMENTS["sft_examples"],
            train_overrides=QUICK_ARGUMENTS["train_overrides"],
            artifact_root=root,
            run_tag="chain",
        )
        eval_metrics = _artifact(dsl.Metrics, work / "eval_metrics")
        eval_outputs = {
            "report": _artifact(dsl.Markdown, work / "report"),
            "report_html": _artifact(dsl.HTML, work / "report_html"),
            "pareto": _artifact(dsl.Artifact, work / "pareto"),
            "latency": _artifact(dsl.Artifact, work / "latency"),
            "results": _artifact(dsl.Artifact, work / "results"),
        }
        eval_out = evaluate_conductor.python_func(
            model=model,
            train_data=data["train"],
            test_data=data["test"],
            eval_metrics=eval_metrics,
            artifact_root=root,
            run_tag="chain",
            **eval_outputs,
        )
        register_out = register_conductor.python_func(
            model=model,
            preset="tiny",
            artifact_root=root,
            run_tag="chain",
            **{k: eval_outputs[k] for k in ("results", "report", "report_html", "pareto")},
        )
        promote_out = promote_conductor.python_func(version=register_out.version)
        yield Chain(
            home=home,
            root=root,
            work=work,
            prepared=prepared,
            data=data,
            stats=stats,
            model=model,
            train_metrics=train_metrics,
            train_out=train_out,
            eval_metrics=eval_metrics,
            eval_outputs=eval_outputs,
            eval_out=eval_out,
            register_out=register_out,
            promote_out=promote_out,
        )


@pytest.fixture
def chain_env(chain: Chain, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Chain:
    """The chain's CONDUCTOR_HOME and S3 credentials, for tests that act on its registry."""
    isolate_home(monkeypatch, chain.home)
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    mlflow_utils.configure()
    return chain


# --------------------------------------------------------------------------- .python_func


@pytest.mark.slow
def test_prepare_data_writes_disjoint_splits_with_counts(chain: Chain) -> None:
    splits = {s: steps.read_tasks(chain.data[s].path) for s in steps.DATA_SPLITS}
    assert [len(splits[s]) for s in steps.DATA_SPLITS] == [TRAIN_LIMIT, EVAL_LIMIT, EVAL_LIMIT]
    for split, tasks in splits.items():
        assert {split_of(t.id) for t in tasks} == {split}
        meta = chain.data[split].metadata
        assert meta["n"] == len(tasks) and sum(meta["domains"].values()) == len(tasks)
        assert chain.stats.metadata[f"{split}/tasks"] == len(tasks)
    assert chain.prepared.dataset == "paper-mix"
    assert chain.prepared.run_folder == f"{chain.root}/chain"
    # the copies below the S3 artifact root are the same bytes
    s3_copy = storage.read_bytes(f"{chain.root}/chain/data/test.jsonl")
    assert s3_copy == Path(chain.data["test"].path).read_bytes()


@pytest.mark.slow
def test_train_conductor_outputs_a_servable_folder(chain: Chain) -> None:
    folder = Path(chain.model.path)
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "conductor.json",
        "prompts/conductor.txt",
    ):
        assert (folder / name).is_file(), name
    assert chain.train_out.global_step == QUICK_ARGUMENTS["grpo_steps"]
    assert chain.model.metadata["base_model"] == "tiny"
    assert chain.train_metrics.metadata["global_step"] == QUICK_ARGUMENTS["grpo_steps"]
    assert chain.train_metrics.metadata["n_train_tasks"] == TRAIN_LIMIT
    # the whole training folder went to S3, final model included
    checkpoints = storage.list_files(chain.train_out.checkpoints)
    assert chain.train_out.checkpoints == f"{chain.root}/chain/checkpoints"
    assert "final/model.safetensors" in checkpoints and "metrics.json" in checkpoints
    assert any(f.startswith("sft/") for f in checkpoints)


@pytest.mark.slow
def test_evaluate_conductor_compares_every_policy(chain: Chain) -> None:
    _, summaries = steps.read_results(chain.eval_outputs["results"].path)
    policies = [s["policy"] for s in summaries]
    assert policies[-1] == "conductor" and "oracle" in policies
    assert {"knn", "domain-router"} <= set(policies)
    assert len([p for p in policies if p.startswith("single:")]) == 7
    assert all(s["n"] == EVAL_LIMIT for s in summaries)
    metrics = chain.eval_metrics.metadata
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["mean_cost_usd"] >= 0.0
    assert metrics["oracle/accuracy"] >= metrics["single:gpt-5/accuracy"]
    assert chain.eval_out.test_split_id == chain.eval_metrics.metadata["test_split_id"]
    assert chain.eval_out.test_split_id.startswith(f"paper-sim-n{EVAL_LIMIT}-")
    assert Path(chain.eval_outputs["pareto"].path).read_bytes()[:8] == PNG_MAGIC
    report = Path(chain.eval_outputs["report"].path).read_text()
    assert "| conductor |" in report and "Pareto front" in report
    page = Path(chain.eval_outputs["report_html"].path).read_text()
    assert "data:image/png;base64," in page and "<table>" in page
    assert storage.list_files(f"{chain.root}/chain/reports") == [
        "latency.png",
        "pareto.png",
        "report.html",
        "report.md",
        "results.json",
    ]
    assert Path(chain.eval_outputs["latency"].path).read_bytes()[:8] == PNG_MAGIC  # issue 13
    assert "## Under a deadline" in report
    # the Conductor minus each policy, question by question, in results.json, report and registry
    meta, _ = steps.read_results(chain.eval_outputs["results"].path)
    against = {r["against"] for r in meta["paired"]}
    assert against == set(policies[:-1]) and all(r["n"] == EVAL_LIMIT for r in meta["paired"])
    assert all(len(s["questions"]["reward"]) == EVAL_LIMIT for s in summaries)
    assert "## Question by question" in report and "Question by question" in page


@pytest.mark.slow
def test_register_conductor_logs_what_the_gate_and_serving_need(chain_env: Chain) -> None:
    out = chain_env.register_out
    assert out.version == 1 and out.model_uri == "models:/conductor/1"
    metrics = registry.version_metrics("conductor", 1)
    assert metrics["test_split_id"] == chain_env.eval_out.test_split_id
    assert metrics["accuracy"] == pytest.approx(chain_env.eval_out.accuracy)
    assert metrics["mean_cost_usd"] == pytest.approx(chain_env.eval_out.mean_cost_usd)
    low, high = metrics["paired_reward_ci_low"], metrics["paired_reward_ci_high"]
    assert low <= metrics["paired_reward_diff"] <= high  # the margin over the best baseline
    row = registry.list_versions("conductor")[0]
    assert row.tags["pipeline.run_tag"] == "chain"
    run = mlflow_utils.client().get_run(row.run_id)
    assert run.data.params["preset"] == "tiny" and run.data.params["base_model"] == "tiny"
    # MLflow's artifacts went to the S3 artifact root, reports included
    assert run.info.artifact_uri.startswith(f"{chain_env.root}/mlflow/")
    logged = {f.path for f in mlflow_utils.client().list_artifacts(row.run_id, "eval")}
    assert logged == {"eval/report.md", "eval/report.html", "eval/pareto.png", "eval/results.json"}
    folder = Path(registry.load_model_dir("models:/conductor/1"))
    assert (folder / "conductor.json").is_file() and (folder / "tokenizer.json").is_file()


@pytest.mark.slow
def test_weak_first_version_is_registered_but_not_champion(chain_env: Chain) -> None:
    """The quick chain's Conductor (two GRPO steps) is below a fixed router of its own evaluation:
    the gate refuses it although there is no champion yet."""
    out = chain_env.promote_out
    assert out.promoted is False and out.champion == 0
    assert "stays registered but not champion" in out.reason
    row = registry.list_versions("conductor")[0]
    assert row.tags["gate.promoted"] == "false" and row.tags["gate.champion_before"] == ""
    assert row.metrics["mean_reward"] < row.metrics["baseline_mean_reward"]


def _register(chain: Chain, results: dsl.Artifact, tag: str) -> Any:
    ev = chain.eval_outputs
    return register_conductor.python_func(
        model=chain.model,
        results=results,
        report=ev["report"],
        report_html=ev["report_html"],
        pareto=ev["pareto"],
        artifact_root=chain.root,
        run_tag=tag,
    )


@pytest.mark.slow
def test_later_registrations_go_through_the_gate(chain_env: Chain) -> None:
    """A version that clears its baselines becomes the first champion; then a stricter gate keeps
    the champion and an equal one moves it. The chain's results stand in for a good evaluation:
    the same file with the Conductor's accuracy set to 1.0."""
    payload = json.loads(Path(chain_env.eval_outputs["results"].path).read_text())
    payload["results"][-1]["accuracy"] = 1.0
    payload["results"][-1]["mean_reward"] = 1.0  # the gate compares rewards where the results carry them
    good = _artifact(dsl.Artifact, chain_env.work / "good_results")
    Path(good.path).write_text(json.dumps(payload))
    latest = max(r.version for r in registry.list_versions("conductor"))
    second = _register(chain_env, good, "chain-2")
    assert second.version == latest + 1
    first = promote_conductor.python_func(version=second.version)
    assert (first.promoted, first.champion) == (True, second.version) and "no champion yet" in first.reason
    third = _register(chain_env, good, "chain-3")
    kept = promote_conductor.python_func(version=third.version, min_accuracy_gain=0.5)
    assert (kept.promoted, kept.champion) == (False, second.version) and "required gain" in kept.reason
    assert registry.get_alias_version("conductor", "challenger") == third.version
    moved = promote_conductor.python_func(version=third.version)  # same split, accuracy and cost: passes
    assert (moved.promoted, moved.champion) == (True, third.version)
    again = promote_conductor.python_func(version=third.version)
    assert again.promoted is False and "already the champion" in again.reason


# --------------------------------------------------------------------------- kfp local runner


@pytest.fixture
def local_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """kfp's SubprocessRunner in this environment, a fresh CONDUCTOR_HOME; local artifact root."""
    isolate_home(monkeypatch, tmp_path / "home")
    with local_session(tmp_path / "kfp"):
        yield tmp_path


@pytest.fixture
def chain_runner(chain: Chain, local_runner: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """:func:`local_runner` with the chain's CONDUCTOR_HOME (its registry); the steps' processes
    start at each component call, so they see it. A test that needs no registry does not wait
    for the chain to train (tens of seconds of the fast tier)."""
    monkeypatch.setenv("CONDUCTOR_HOME", str(chain.home))
    return local_runner


@dsl.component(base_image="python:3.11", packages_to_install=[], install_kfp_package=False)
def _double(x: int) -> int:
    return 2 * x


def test_a_local_session_keeps_kfps_workspace_under_its_root_and_removes_it(tmp_path: Path) -> None:
    """kfp.local.init left a /tmp/kfp-workspace-* folder behind for each lone component run."""
    from kfp.local import config

    with local_session(tmp_path / "kfp") as workspace:
        assert workspace.parent == tmp_path / "kfp" and workspace.is_dir()
        assert config.LocalExecutionConfig.instance.workspace_root == str(workspace)
        assert _double(x=21).output == 42  # a lone component runs (kfp removes it only after a pipeline)
        assert workspace.is_dir()
    assert not workspace.exists()
    assert [p.name for p in (tmp_path / "kfp").iterdir() if p.name.startswith("kfp-workspace-")] == []


def test_prepare_data_on_the_local_runner(local_runner: Path) -> None:
    task = prepare_data(
        train_limit=10, eval_limit=5, seed=3, artifact_root=str(local_runner / "root"), run_tag="r1"
    )
    train = steps.read_tasks(task.outputs["train_data"].path)
    assert len(train) == 10 and all(split_of(t.id) == "train" for t in train)
    meta = task.outputs["test_data"].metadata
    assert meta["n"] == 5 and sum(meta["domains"].values()) == 5  # ints come back as floats: equal anyway
    assert task.outputs["run_folder"] == str(local_runner / "root" / "r1")
    assert (local_runner / "root" / "r1" / "data" / "validation.jsonl").is_file()


@pytest.mark.slow
def test_promote_conductor_on_the_local_runner(chain_runner: Path, chain: Chain) -> None:
    task = promote_conductor(version=1, min_accuracy_gain=2.0)  # v1: the chain's weak Conductor
    assert task.outputs["promoted"] is False
    assert task.outputs["champion"] != 1
    assert "stays registered but not champion" in task.outputs["reason"]


@dsl.pipeline(name="register-imported")
def register_imported(model_dir: str, results: str, report: str, report_html: str, pareto: str) -> int:
    """Import the chain's model and evaluation outputs and register them on the local runner."""
    imported = {
        name: dsl.importer(artifact_uri=uri, artifact_class=cls, reimport=True).output
        for name, uri, cls in (
            ("model", model_dir, dsl.Model),
            ("results", results, dsl.Artifact),
            ("report", report, dsl.Markdown),
            ("report_html", report_html, dsl.HTML),
            ("pareto", pareto, dsl.Artifact),
        )
    }
    return register_conductor(model_name="conductor-local", run_tag="local-register", **imported).outputs[
        "version"
    ]


@pytest.mark.slow
def test_register_conductor_on_the_local_runner(chain_runner: Path, chain: Chain) -> None:
    ev = chain.eval_outputs
    task = register_imported(
        model_dir=chain.model.path,
        results=ev["results"].path,
        report=ev["report"].path,
        report_html=ev["report_html"].path,
        pareto=ev["pareto"].path,
    )
    assert task.outputs["Output"] == 1  # first version of its own model name
    mlflow_utils.configure()
    assert registry.get_alias_version("conductor-local", "challenger") == 1
    metrics = registry.version_metrics("conductor-local", 1)
    assert metrics["test_split_id"] == chain.eval_out.test_split_id
    assert metrics["accuracy"] == pytest.approx(chain.eval_out.accuracy)
    folder = Path(registry.load_model_dir("models:/conductor-local@challenger"))
    assert (folder / "conductor.json").read_bytes() == (
        Path(chain.model.path) / "conductor.json"
    ).read_bytes()


# --------------------------------------------------------------------------- step helpers (no KFP)


def test_test_split_id_depends_on_the_tasks_and_the_pool(tmp_path: Path) -> None:
    tasks = steps.read_tasks(_write_sample(tmp_path))
    same = steps.test_split_id(list(reversed(tasks)), "paper-sim")
    assert steps.test_split_id(tasks, "paper-sim") == same and same.startswith(f"paper-sim-n{len(tasks)}-")
    assert steps.test_split_id(tasks[:-1], "paper-sim") != same
    assert steps.test_split_id(tasks, "routellm-replay") != same


def test_register_prepared_names_the_set_by_its_tasks(tmp_path: Path) -> None:
    from rl_conductor.tasks.datasets import load_tasks

    path = _write_sample(tmp_path)
    name = steps.register_prepared([path])
    assert name == steps.register_prepared([path]) and name.startswith("prepared-")
    assert [t.id for t in load_tasks(name, "test")] == [t.id for t in steps.read_tasks(path)]
    assert load_tasks(name, "train") == []


def test_training_overrides_are_checked() -> None:
    assert steps.parse_overrides('{"num_generations": 4}') == {"num_generations": 4}
    assert steps.parse_overrides("") == {}
    with pytest.raises(ValueError, match="unknown training config keys"):
        steps.parse_overrides('{"num_generation": 4}')
    with pytest.raises(ValueError, match="prepared train split"):
        steps.parse_overrides({"train_limit": 10})
    with pytest.raises(ValueError, match="JSON object"):
        steps.parse_overrides("[1, 2]")


def test_run_folder_is_safe_below_the_root() -> None:
    assert steps.run_folder("s3://b/p", "conductor-training-2026-01-01 10:00") == (
        "s3://b/p/conductor-training-2026-01-01-10-00"
    )
    assert steps.run_folder("/data", "../../etc") == "/data/etc"
    assert steps.run_folder("/data", "..") == "/data/run"


def _write_sample(folder: Path) -> Path:
    from rl_conductor.tasks.datasets import load_tasks

    path = folder / "sample.jsonl"
    steps.write_tasks(path, load_tasks("paper-mix", "test", limit=6, seed=1))
    return path
