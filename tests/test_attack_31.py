"""Findings of the 31st outside attack (notes: /work/notes/attack-31.md), each pinned by a test that
failed before its fix: bring-your-own recordings, the closed loop's traffic stores, and the CLI.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_conductor.evaluation.suite import run_eval
from rl_conductor.loop import traffic as tl
from rl_conductor.serving.request import ConductorRequest
from rl_conductor.tasks.recordings_format import RecordingsError, load_recordings
from rl_conductor.validation import InvalidValue


def _recordings_pool(tmp_path: Path, rows: list[dict[str, Any]], name: str = "byo") -> Path:
    rec = tmp_path / f"{name}.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pool = tmp_path / f"{name}.yaml"
    worker = {"name": "m1", "kind": "replay", "price_in": 2.5, "price_out": 10.0, "hosting": "external"}
    pool.write_text(yaml.safe_dump({"name": name, "recordings": str(rec), "workers": [worker]}))
    return pool


def _item(i: int, **response: Any) -> dict[str, Any]:
    return {"id": f"x/{i}", "split": "test", "question": f"What is {i} + 1?", "answer": str(i + 1),
            "grader": "math", "domain": "math",
            "responses": {"m1": {"text": f"#### {i + 1}", **response}}}  # fmt: skip


# --------------------------------------------------------------------------- F1: recorded cost vs budget


@pytest.mark.parametrize("recorded", [{"cost_usd": 5.0}, {"input_tokens": 10**9}])
def test_a_recorded_cost_above_the_calls_worst_case_never_passes_the_budget(
    tmp_path: Path, recorded: dict[str, Any]
) -> None:
    """A recording that says a call cost $5 (or read 10^9 tokens) while the pool's prices bound the
    call at cents: before, the $0.01 budget was charged $5.00 a question (accuracy 100 %, exit 0)."""
    pool = _recordings_pool(tmp_path, [_item(i, **recorded) for i in range(4)])
    for budget in (0.01, None):
        (run,) = run_eval(["single:m1"], pool=str(pool), dataset=None, split="test", limit=None, seed=0,
                          progress=False, max_cost_usd=budget)  # fmt: skip
        assert run["mean_cost_usd"] <= (budget or 0.05)
        assert run["failed_call_rate"] == 1.0 and run["accuracy"] == 0.0
        assert any("above this call's worst case" in e for e in run["call_errors"])
    consistent = _recordings_pool(tmp_path, [_item(i, cost_usd=0.0002) for i in range(4)], name="ok")
    (run,) = run_eval(["single:m1"], pool=str(consistent), dataset=None, split="test", limit=None, seed=0,
                      progress=False, max_cost_usd=0.01)  # fmt: skip
    assert run["accuracy"] == 1.0 and run["mean_cost_usd"] == pytest.approx(0.0002)


# --------------------------------------------------------------------------- F2: NaN / Infinity


@pytest.mark.parametrize(("key", "raw"), [("cost_usd", "NaN"), ("cost_usd", "Infinity"), ("latency_s", "NaN"),
                                          ("latency_s", "-Infinity")])  # fmt: skip
def test_nan_and_infinity_in_recordings_fail_at_load(tmp_path: Path, key: str, raw: str) -> None:
    path = tmp_path / "bad.jsonl"
    row = json.dumps(_item(0)).replace('"text": "#### 1"', f'"text": "#### 1", "{key}": {raw}')
    path.write_text(row + "\n", encoding="utf-8")
    with pytest.raises(RecordingsError, match=f"{key} must be a finite number >= 0"):
        load_recordings(path)


def _doc(rid: str) -> dict[str, Any]:
    return {
        "request_id": rid,
        "answer": "42",
        "workflow": [],
        "steps": [],
        "tokens": 1,
        "input_tokens": 1,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "latency_s": 0.1,
    }


# --------------------------------------------------------------------------- F7: nested traffic stores


@pytest.mark.parametrize(
    ("public", "private"),
    [
        ("pub", "pub/traffic"),  # the private batches would sit below the public store's traffic/
        ("pub", "pub/sub"),
        ("pub/sub", "pub"),  # the public store inside the private one
        ("s3://bucket/t", "s3://bucket/t/private"),
        ("s3://bucket/t/", "s3://bucket/t"),
    ],
)
def test_a_private_store_inside_or_around_the_public_one_is_refused(
    tmp_path: Path, public: str, private: str
) -> None:
    def where(u: str) -> str:
        return u if u.startswith("s3://") else str(tmp_path / u)

    with pytest.raises(InvalidValue, match="--traffic_private_store"):
        tl.TrafficConfig(store=where(public), private_store=where(private))


def test_sibling_stores_are_accepted_and_stay_apart(tmp_path: Path) -> None:
    """``pub`` and ``pub-private`` (and S3 prefixes alike) share a string prefix, not a folder."""
    tl.TrafficConfig(store="s3://bucket/t", private_store="s3://bucket/t-private")
    public, private = tmp_path / "pub", tmp_path / "pub-private"
    log = tl.TrafficLog(tl.TrafficConfig(store=str(public), private_store=str(private)))
    log.submit(ConductorRequest(question="secret", sensitivity="private"), _doc("p1"), "v1")
    log.submit(ConductorRequest(question="open"), _doc("o1"), "v1")
    log.close()
    assert [r["request_id"] for r in tl.read_traffic(str(public))] == ["o1"]
    assert [r["request_id"] for r in tl.read_traffic(str(private))] == ["p1"]


def test_an_s3_store_without_a_bucket_is_refused() -> None:
    with pytest.raises(InvalidValue, match="--traffic_store"):
        tl.TrafficConfig(store="s3://")


# --------------------------------------------------------------------------- F9: retrain's arguments


def test_retrain_arguments_take_ints_for_floats_and_refuse_bad_ones_before_running(tmp_path: Path) -> None:
    """``--set spend_cap_usd=5`` failed the run inside kfp (an int for a float input); an unknown
    name, a negative window, a pool that does not exist or a missing store failed a step, the
    reason only in its log. Now: the float, or one line naming the value, before anything runs."""
    from rl_conductor.errors import UsageError
    from rl_conductor.loop.pipeline import retrain_arguments

    store = str(tmp_path)
    got = retrain_arguments(traffic_store=store, spend_cap_usd=5, holdout_fraction=1, window_hours=None)
    assert got == {"traffic_store": store, "spend_cap_usd": 5.0, "holdout_fraction": 1.0}
    assert isinstance(got["spend_cap_usd"], float)
    for bad, says in (
        ({"bogus": 1}, "unknown retrain parameters ['bogus']"),
        ({"window_hours": -1}, "invalid window_hours"),
        ({"window_hours": float("nan")}, "invalid window_hours"),
        ({"holdout_fraction": 2}, "invalid holdout_fraction"),
        ({"eval_limit": -3}, "invalid eval_limit"),
        ({"min_reward_gain": "abc"}, "invalid min_reward_gain"),
        ({"only_on_pool_change": 1}, "invalid only_on_pool_change"),
        ({"pool": "nopool"}, "no pool named 'nopool'"),
        ({"traffic_store": str(tmp_path / "nowhere")}, "invalid traffic_store"),
        ({"traffic_store": "s3://"}, "invalid traffic_store"),
    ):
        with pytest.raises(UsageError, match=re.escape(says)):
            retrain_arguments(**{"traffic_store": store, **bad})


def test_retrain_cli_says_why_in_one_line_and_exits_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rl_conductor.cli import app

    base = ["retrain", "run", "--local", "--traffic-store", str(tmp_path)]
    for extra, says in ((["--pool", "nopool"], "no pool named 'nopool'"), (["--set", "bogus=1"], "bogus"),
                        (["--window-hours", "-1"], "invalid window_hours")):  # fmt: skip
        result = CliRunner().invoke(app, [*base, *extra])
        assert result.exit_code == 2, result.output
        assert says in result.output and "step output in" not in result.output


def test_retrain_without_a_champion_says_so_before_running(
    tmp_path: Path, mlflow_db_template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from typer.testing import CliRunner

    from rl_conductor.cli import app
    from rl_conductor.tracking import mlflow_utils

    db = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_db_template, db)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.setenv(mlflow_utils.HOME_ENV, str(tmp_path / "home"))
    try:
        args = ["retrain", "run", "--local", "--traffic-store", str(tmp_path), "--set", "model_name=nobody"]
        result = CliRunner().invoke(app, args)
    finally:
        mlflow_utils.reset()
    assert result.exit_code == 1, result.output
    assert "nobody has no champion: train one first" in result.output
    assert "step output in" not in result.output  # said before the pipeline ran


def test_training_pipeline_set_takes_an_int_for_a_float() -> None:
    """``conductor pipeline run --local --set cost_weight=1`` failed inside kfp (NUMBER_INTEGER vs
    NUMBER_DOUBLE) after the run had started."""
    from rl_conductor.pipeline.runner import pipeline_arguments

    got = pipeline_arguments(cost_weight=1, min_accuracy_gain=0, eval_limit=2)
    assert got["cost_weight"] == 1.0 and isinstance(got["cost_weight"], float)
    assert isinstance(got["min_accuracy_gain"], float) and got["eval_limit"] == 2
    assert isinstance(got["eval_limit"], int)


# --------------------------------------------------------------------------- F4: an empty split


def test_eval_of_a_split_with_no_questions_is_an_error_not_a_table_of_dashes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rl_conductor.cli import app

    rows = [{**_item(i), "split": "train"} for i in range(3)]
    pool = _recordings_pool(tmp_path, rows)
    result = CliRunner().invoke(
        app, ["eval", "--pool", str(pool), "--policy", "single:m1", "--split", "test"]
    )
    assert result.exit_code == 2, result.output
    # every item says train and none validation: one of the three is carved out as validation
    assert "split 'test' of dataset" in result.output and "(train 2, validation 1, test 0)" in result.output
    ok = CliRunner().invoke(app, ["eval", "--pool", str(pool), "--policy", "single:m1", "--split", "train"])
    assert ok.exit_code == 0, ok.output


# --------------------------------------------------------------------------- F6: nothing answered


def test_train_stops_with_the_reason_when_no_worker_answers_a_training_question(tmp_path: Path) -> None:
    """A recordings pool trained on a dataset it holds none of (``--dataset gsm8k``): every call of
    the warm start's table failed and training ran to the end, exit 0, ``reward 0.000``."""
    from typer.testing import CliRunner

    from rl_conductor.cli import app

    pool = _recordings_pool(tmp_path, [{**_item(i), "split": "train"} for i in range(6)])
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"model": "tiny", "tiny_vocab_size": 512, "tiny_hidden_size": 32,
                                      "tiny_layers": 1, "tiny_intermediate_size": 64, "sft_examples": 8,
                                      "grpo_steps": 1, "warm_items_per_domain": 4,
                                      "warm_cache_dir": str(tmp_path / "cache")}))  # fmt: skip
    args = ["train", "--preset", str(preset), "--pool", str(pool), "--dataset", "gsm8k", "--out"]
    result = CliRunner().invoke(app, [*args, str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert (
        "no worker answered any of the" in result.output and "no recording of task 'gsm8k/" in result.output
    )
    assert not (tmp_path / "run" / "final").exists()


# --------------------------------------------------------------------------- F5: plan --execute


def test_plan_execute_answers_a_recorded_item_and_fails_loudly_on_free_text(
    micro: Any, tmp_path: Path
) -> None:
    """On a replay pool ``plan --execute "free text"`` printed a blank answer, $0, 0 calls and exited
    0 (the replay worker refuses free text); a question that is a recorded item got the same."""
    from typer.testing import CliRunner

    from rl_conductor.cli import app

    pool = _recordings_pool(tmp_path, [_item(i) for i in range(3)])
    base = ["plan", str(micro.final_dir), "--pool", str(pool), "--execute"]
    item = CliRunner().invoke(app, [*base[:2], "What is 1 + 1?", *base[2:]])
    assert item.exit_code == 0, item.output
    assert "final answer: #### 2" in item.output and "calls 1" in item.output
    free = CliRunner().invoke(app, [*base[:2], "Tell me a joke.", *base[2:]])
    assert free.exit_code == 1, free.output
    assert (
        "no worker answered the question" in free.output
        and "no recording of task 'cli/question'" in free.output
    )


# --------------------------------------------------------------------------- F8: the documented flag


def test_traffic_index_size_is_a_flag_as_documented() -> None:
    """docs/closed-loop.md names ``--traffic_index_size``; the predictor refused it as unrecognised."""
    import argparse

    from rl_conductor.loop.serving import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(["--traffic_store", "/tmp/s", "--traffic_index_size", "7"]))
    assert config is not None and config.index_size == 7
    with pytest.raises(InvalidValue, match="--traffic_index_size"):
        config_from_args(parser.parse_args(["--traffic_store", "/tmp/s", "--traffic_index_size", "0"]))
