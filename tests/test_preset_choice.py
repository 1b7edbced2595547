"""``conductor train --preset a,b`` / ``--preset auto``: candidates trained on one pool, dataset
and reward, the best on the validation split kept, the test split never read
(rl_conductor/pipeline/choose.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from rl_conductor.cli import app
from rl_conductor.errors import ConfigError
from rl_conductor.pipeline import choose
from rl_conductor.tasks import datasets
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.training.config import MICRO_SETTINGS, TrainConfig, load_preset


def _pool(
    tmp_path: Path, *, texts: bool = True, splits: bool = False, n: int = 90, only: str | None = None
) -> Path:
    """A recordings pool of three made-up workers over ``n`` GSM8K items (``texts``: answers keep
    their text; ``splits``: every item says train or test, none validation; ``only``: every
    item says that split)."""
    rows = []
    for i, t in enumerate(load_tasks("gsm8k", limit=n, seed=3)):
        right = {"strong": i % 10 < 8, "medium": i % 10 < 5, "weak": i % 10 < 2}
        rows.append({
            "id": t.id, "question": t.question, "answer": t.answer, "grader": "math", "domain": t.domain,
            **({"split": only or ("train" if i % 3 else "test")} if splits else {}),
            "responses": {
                m: ({"text": f"#### {t.answer if ok else '-1'}"} if texts else {"correct": ok})
                | {"cost_usd": c}
                for (m, ok), c in zip(right.items(), (0.004, 0.001, 0.0002), strict=True)
            },
        })  # fmt: skip
    rec = tmp_path / "rec.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump({"name": "three", "recordings": str(rec), "workers": [
        {"name": m, "kind": "replay", "price_in": 1.0, "price_out": 1.0} for m in ("strong", "medium", "weak")
    ]}))  # fmt: skip
    return pool


def test_auto_names_the_recordings_presets_by_what_the_file_keeps(tmp_path: Path) -> None:
    texts = _pool(tmp_path)
    labels_dir = tmp_path / "labels"
    labels_dir.mkdir()
    labels = _pool(labels_dir, texts=False)
    assert choose.candidate_presets("auto", str(texts), None) == ["recordings", "recordings-text"]
    assert choose.candidate_presets("auto", str(labels), None) == ["recordings"]  # nothing to read
    assert choose.candidate_presets("tiny", None, None) == ["tiny"]
    assert choose.candidate_presets(" tiny , tiny-rounds", None, None) == ["tiny", "tiny-rounds"]
    (tmp_path / "p.yaml").write_text("model: tiny\n")
    with pytest.raises(ConfigError, match="dataset 'gsm8k' is not a recordings file"):
        choose.candidate_presets("auto", str(texts), "gsm8k")
    # candidate folders are plain names under OUT/candidates, whatever the spec's path
    assert choose.folder_names(["tiny", "/x/a.yaml", "../b/a.yaml", "../../c d.yml", "..yaml"]) == {
        "tiny": "tiny", "/x/a.yaml": "a", "../b/a.yaml": "a-2", "../../c d.yml": "c_d", "..yaml": "preset",
    }  # fmt: skip
    # one folder on a case-insensitive disk: kept apart everywhere
    assert choose.folder_names(["/x/Mine.yaml", "/y/mine.yaml"]) == {
        "/x/Mine.yaml": "Mine",
        "/y/mine.yaml": "mine-2",
    }
    for spec, pool, match in [
        ("auto", None, "needs --pool"),
        ("auto", "paper-sim", "replays no recordings file"),
        ("auto,tiny", str(texts), "stands alone"),
        ("tiny,,smol", None, "empty name"),
        ("tiny,tiny", None, "listed twice"),
        (f"{tmp_path}/p.yaml,{tmp_path}/./p.yaml", None, "listed twice"),  # one file, two spellings
        ("auto", str(texts).replace("pool.yaml", "none.yaml"), "no pool file at"),
    ]:
        with pytest.raises(ConfigError, match=match):
            choose.candidate_presets(spec, pool, None)


def test_candidates_that_cannot_be_compared_are_refused_before_training(tmp_path: Path) -> None:
    pool = str(_pool(tmp_path))
    # the two recordings presets train for different rewards unless --cost-weight says one
    with pytest.raises(ConfigError, match=r"different rewards.*--cost-weight"):
        choose.check_candidates({n: load_preset(n, pool=pool) for n in ("recordings", "recordings-text")})
    same = {n: load_preset(n, pool=pool, cost_weight=0.13) for n in ("recordings", "recordings-text")}
    assert choose.check_candidates(same)[0] == pool
    with pytest.raises(ConfigError, match="different pools"):
        choose.check_candidates({"tiny": load_preset("tiny"), "recordings": load_preset("recordings")})
    # the same pool file spelled two ways is one pool
    other = str(Path(pool).parent / "." / Path(pool).name)
    tiny = load_preset("tiny", pool=pool)
    assert choose.check_candidates({"a": tiny, "b": load_preset("smol", pool=other)})
    # a reward preset that differs is named, not two identical weights
    with pytest.raises(ConfigError, match="paper at cost weight"):
        choose.check_candidates({"a": tiny, "b": load_preset("tiny", pool=pool, reward_preset="paper")})
    # an unknown model is found before the first candidate trains
    with pytest.raises(ConfigError, match="preset b: unknown model spec"):
        choose.check_candidates({"a": tiny, "b": load_preset("tiny", pool=pool, model="no such model")})
    # a file that says train or test for every item: its validation split is carved from train
    (tmp_path / "s").mkdir()
    split_pool = str(_pool(tmp_path / "s", splits=True))
    assert choose.check_candidates({n: load_preset(n, pool=split_pool, seed=1) for n in ("tiny", "smol")})
    # a file with no training or validation item: no fair place to choose
    (tmp_path / "t").mkdir()
    test_pool = str(_pool(tmp_path / "t", splits=True, only="test"))
    with pytest.raises(ConfigError, match=r'no validation items.*"split": "validation"'):
        choose.check_candidates({n: load_preset(n, pool=test_pool, seed=1) for n in ("tiny", "smol")})


def test_train_auto_without_a_pool_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "o"), "--preset", "auto"])
    assert res.exit_code == 2, res.output
    assert "needs --pool" in res.output and "Traceback" not in res.output
    pool = str(_pool(tmp_path))
    res = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "o"), "--preset", "auto", "--pool", pool])
    assert res.exit_code == 2 and "different rewards" in res.output, res.output
    assert not (tmp_path / "o" / "candidates").exists()  # refused before any training
    missing = f"recordings:{tmp_path / 'missing.jsonl'}"
    res = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "o"), "--preset", "auto", "--pool", pool,
                                   "--dataset", missing, "--cost-weight", "0.1"])  # fmt: skip
    assert res.exit_code == 2 and "cannot read the recordings" in res.output, res.output
    # a file where the output folder or its final/ goes: one line before training, not a traceback after
    (tmp_path / "o").mkdir(exist_ok=True)
    (tmp_path / "o" / "final").write_text("not a folder")
    res = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "o"), "--preset", "tiny,tiny-rounds",
                                   "--pool", pool, "--cost-weight", "0.1"])  # fmt: skip
    assert res.exit_code == 2 and "is a file, where a folder goes" in res.output, res.output
    res = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "o" / "final"), "--preset", "tiny"])
    assert res.exit_code == 2 and "--out" in res.output and "Traceback" not in res.output, res.output


def _micro(tmp_path: Path, pool: Path, **extra: Any) -> TrainConfig:
    return TrainConfig(**{
        **MICRO_SETTINGS, "pool": str(pool), "train_limit": None, "sft_examples": 48, "sft_epochs": 1.0,
        "grpo_steps": 1, "cost_weight": 0.1, "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        **extra,
    })  # fmt: skip


@pytest.mark.slow
def test_the_best_candidate_on_validation_is_kept_and_the_test_split_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    pool = _pool(tmp_path, n=120)
    read: list[str] = []
    real = datasets.load_tasks

    def spy(name: str, split: str | None = None, *args: Any, **kw: Any) -> Any:
        read.append(str(split))
        return real(name, split, *args, **kw)

    import rl_conductor.evaluation.suite as suite
    import rl_conductor.tasks as tasks_package

    for module in (datasets, suite, tasks_package):  # every name it is imported under
        monkeypatch.setattr(module, "load_tasks", spy)
    cfgs = {
        "expected": _micro(tmp_path, pool, sft_targets="expected-best", max_rounds=2, review_evidence="text"),
        "random": _micro(tmp_path, pool, sft_targets="random", seed=1),
    }
    out = tmp_path / "out"
    (out / "final").mkdir(parents=True)
    (out / "final" / "stale").write_text("from another run")
    found = choose.train_and_choose(cfgs, out, progress=False)
    assert not (out / "final" / "stale").exists()  # final/ is the chosen candidate's alone
    assert "test" not in read and "validation" in read  # chosen on validation, test untouched
    rewards = {n: s["mean_reward"] for n, s in found.candidates.items()}
    assert found.chosen == max(rewards, key=lambda n: (rewards[n], n == "expected"))
    assert found.n == len(real(load_tasks_name(pool), "validation")) > 0
    saved = json.loads((out / choose.CHOICE_FILE).read_text())
    assert saved["chosen"] == found.chosen and set(saved["candidates"]) == {"expected", "random"}
    assert set(saved["baselines"]) == {"knn", "knn:k=auto", "domain-router", "cascade:all", "cascade:domain"}
    assert saved["reward"]["cost_weight"] == 0.1
    other = next(n for n in rewards if n != found.chosen)
    assert saved["margins"][other]["difference"] == pytest.approx(rewards[found.chosen] - rewards[other])
    for name, base in saved["baselines"].items():  # chosen minus each baseline, with its SE
        margin = saved["baseline_margins"][name]
        assert margin["difference"] == pytest.approx(rewards[found.chosen] - base["mean_reward"])
        assert margin["se"] is None or margin["se"] >= 0
    # `eval` of both candidates side by side reports what the choice saw: each with its own rounds
    from rl_conductor.evaluation.suite import run_eval

    specs = [f"conductor:{out / 'candidates' / n / 'final'}" for n in ("expected", "random")]
    again = run_eval(specs, pool=str(pool), dataset=None, split="validation", limit=None, seed=0,
                     progress=False, cost_weight=0.1, max_rounds=None)  # fmt: skip
    for name, summary in zip(("expected", "random"), again, strict=True):
        assert summary["mean_reward"] == pytest.approx(rewards[name]), name
    assert found.candidates["expected"]["max_rounds"] == 2
    assert all(c["failed_call_rate"] == 0.0 for c in found.candidates.values())  # what the CLI warns on
    seen: list[int] = []
    real_evaluate = suite.evaluate

    def spy_evaluate(policy: Any, view: Any, tasks: Any, limits: Any, **kw: Any) -> Any:
        seen.append(limits.max_rounds)
        return real_evaluate(policy, view, tasks[:2], limits, **kw)

    monkeypatch.setattr(suite, "evaluate", spy_evaluate)
    run_eval([*specs, "knn"], pool=str(pool), dataset=None, split="validation", limit=None, seed=0,
             progress=False, cost_weight=0.1, max_rounds=None)  # fmt: skip
    assert seen == [2, 1, 1]  # not the first Conductor's rounds for every policy
    # the final folder is the chosen candidate's, and says so
    meta = json.loads((out / "final" / "conductor.json").read_text())
    assert meta["preset_choice"]["chosen"] == found.chosen
    chosen_weights = (out / "candidates" / found.chosen / "final" / "model.safetensors").read_bytes()
    assert (out / "final" / "model.safetensors").read_bytes() == chosen_weights


def load_tasks_name(pool: Path) -> str:
    from rl_conductor.workers.pool import load_pool

    return load_pool(str(pool)).default_dataset()


@pytest.mark.slow
def test_the_pipelines_train_step_chooses_among_a_list_of_presets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kfp ``train_conductor`` step (pipeline/steps.py train_step) takes ``preset: a,b`` as
    ``conductor train`` does: both train under ``checkpoints/candidates``, the better on the
    prepared validation split is the model, and the prepared test split is never registered."""
    from rl_conductor.pipeline import steps

    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    pool = _pool(tmp_path, n=120)
    files = {s: str(tmp_path / f"{s}.jsonl") for s in ("train", "validation", "test")}
    steps.prepare_data(outputs=files, pool=str(pool), artifact_root=str(tmp_path / "art"))
    presets = []
    for name, seed in (("a", 0), ("b", 1)):
        cfg = _micro(tmp_path, pool, sft_targets="random", seed=seed).to_dict()
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        presets.append(str(tmp_path / f"{name}.yaml"))
    registered: list[list[str]] = []
    real = steps.register_prepared

    def spy(paths: Any) -> str:
        registered.append([Path(p).stem for p in paths])
        return real(paths)

    monkeypatch.setattr(steps, "register_prepared", spy)
    outcome = steps.train_step(
        train_path=files["train"], validation_path=files["validation"], model_dir=str(tmp_path / "model"),
        preset=",".join(presets), pool=str(pool), cost_weight=0.1, artifact_root=str(tmp_path / "art"),
        run_tag="r1",
    )  # fmt: skip
    assert registered == [["train", "validation"]]
    root = tmp_path / "art" / "r1" / "checkpoints"
    choice = json.loads((root / choose.CHOICE_FILE).read_text())
    assert set(choice["candidates"]) == {"a", "b"} and choice["split"] == "validation"
    assert choice["n"] == len(steps.read_tasks(files["validation"]))
    weights = (root / "candidates" / choice["chosen"] / "final" / "model.safetensors").read_bytes()
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == weights
    meta = json.loads((tmp_path / "model" / "conductor.json").read_text())
    assert meta["preset_choice"]["chosen"] == choice["chosen"]
    assert outcome.global_step == 1 and outcome.model_dir == str(tmp_path / "model")
    assert outcome.chosen_preset == presets[["a", "b"].index(choice["chosen"])]
    assert set(outcome.better_baselines) <= set(choose.BASELINES)
    # one preset trains on the train split alone, as before; a list without validation data is refused
    with pytest.raises(ConfigError, match="validation split"):
        steps.train_step(train_path=files["train"], model_dir=str(tmp_path / "m2"), preset=",".join(presets))
    # auto reads the dataset the pipeline prepared (a label-only file trains one preset), as the CLI does
    asked: list[Any] = []

    def spy_presets(spec: str, pool_arg: Any, dataset: Any) -> Any:
        asked.append(dataset)
        raise ConfigError("stop here")

    monkeypatch.setattr(choose, "candidate_presets", spy_presets)
    with pytest.raises(ConfigError, match="stop here"):
        steps.train_step(
            train_path=files["train"], model_dir=str(tmp_path / "m3"), preset="auto", dataset="recordings:x"
        )
    assert asked == ["recordings:x"]
