"""The ``conductor`` CLI answers bad input with one clear line on stderr, never a traceback.

Every row of issue 14's table and every validated option runs through Typer's CliRunner (the
same click group the installed script uses); one row also runs as a real subprocess. Each must
fail before any heavy work (no evaluation, no training), exit 2 (usage) or 1 (run time), print
at most two lines on stderr without "Traceback", and name the bad value. ``--debug`` and
``CONDUCTOR_DEBUG=1`` bring the traceback back; real bugs keep theirs. The README's command
lines are parsed (every option and value checked, nothing run).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rl_conductor import errors, validation
from rl_conductor.cli import app
from rl_conductor.cli.app import DEBUG_ENV

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _fails(args: list[str], *, code: int, names: str) -> str:
    result = runner.invoke(app, args)
    stderr = result.stderr
    assert result.exit_code == code, (result.exit_code, stderr, result.stdout, result.exception)
    assert "Traceback" not in stderr and "Traceback" not in result.stdout
    lines = stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, stderr
    assert lines[0].startswith("Error: "), stderr
    assert names in stderr, (names, stderr)
    return stderr


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)


# -- the issue's table ---------------------------------------------------------------------------
ISSUE_ROWS = [
    (["eval", "--policy", "nonsense"], 2, "'nonsense'", "known kinds: cascade, conductor"),
    (["eval", "--policy", "single:nobody"], 2, "'nobody'", "it has ['gpt-5'"),
    (["eval", "--policy", "single:gpt-5", "--pool", "nopool"], 2, "'nopool'", "built-in pools"),
    (["eval", "--policy", "cascade:gpt-5,qwen3-32b", "--max-rounds", "0"], 2, "--max-rounds", ">= 1"),
    (["eval", "--policy", "cascade:gpt-5>qwen3-32b"], 2, "'gpt-5'", "a,b or a*2"),
    (
        ["eval", "--policy", "conductor:/nonexistent"],
        2,
        "no Conductor model at /nonexistent",
        "expected a folder with conductor.json",
    ),
    (
        ["eval", "--policy", "single:gpt-5", "--max-cost-usd", "-1", "--limit", "3"],
        2,
        "'--max-cost-usd': -1.0",
        "expected a finite number > 0",
    ),
    (["pool", "calibrate", "--pool", "paper-sim", "--n", "-5"], 2, "'--n': -5", "an integer >= 1"),
    (
        ["train", "--preset", "nope", "--out", "/tmp/x"],
        2,
        "'nope'",
        # every preset shipped, as the message lists them (the list grows with each new preset)
        "presets: " + str(sorted(p.stem for p in (ROOT / "src/rl_conductor/configs/train").glob("*.yaml"))),
    ),
]


@pytest.mark.parametrize(
    ("args", "code", "bad", "valid"), ISSUE_ROWS, ids=[" ".join(r[0]) for r in ISSUE_ROWS]
)
def test_issue_rows(args: list[str], code: int, bad: str, valid: str, tmp_path: Path) -> None:
    stderr = _fails([a.replace("/tmp/x", str(tmp_path / "x")) for a in args], code=code, names=bad)
    assert valid in stderr
    assert not (tmp_path / "x").exists()  # train stopped before creating anything


def test_a_real_subprocess_prints_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rl_conductor.cli", "eval", "--policy", "single:gpt-5", "--pool", "nopool"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != DEBUG_ENV},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "Error: no pool named 'nopool'; built-in pools: "
        + str(sorted(p.stem for p in (ROOT / "src/rl_conductor/configs/pools").glob("*.yaml")))
    )
    assert proc.stdout == ""


# -- every validated option ------------------------------------------------------------------------
OPTION_ROWS = [
    (["eval", "--policy", "random", "--limit", "0"], "'--limit': 0", ">= 1"),
    (["eval", "--policy", "random", "--concurrency", "0"], "'--concurrency': 0", ">= 1"),
    (["eval", "--policy", "random", "--seed", "-1"], "'--seed': -1", ">= 0"),
    (["eval", "--policy", "random", "--max-cost-usd", "0"], "'--max-cost-usd': 0.0", "> 0"),
    (["eval", "--policy", "random", "--max-cost-usd", "inf"], "'--max-cost-usd': inf", "finite"),
    (["eval", "--policy", "random", "--max-latency-s", "0"], "'--max-latency-s': 0.0", "> 0"),
    (["eval", "--policy", "random", "--sensitivity", "secret"], "'secret'", "public, private"),
    (["eval", "--policy", "random", "--split", "dev"], "'dev'", "train, validation, test, all"),
    (["compare", "--limit", "0"], "'--limit': 0", ">= 1"),
    (["compare", "--split", "dev"], "'dev'", "train, validation, test, all"),
    (["compare", "--seed", "-3"], "'--seed': -3", ">= 0"),
    (["pool", "calibrate", "--n", "0"], "'--n': 0", ">= 1"),
    (["pool", "calibrate", "--seed", "-1"], "'--seed': -1", ">= 0"),
    (["train", "--out", "OUT", "--grpo-steps", "0"], "'--grpo-steps': 0", ">= 1"),
    (["train", "--out", "OUT", "--sft-examples", "0"], "'--sft-examples': 0", ">= 1"),
    (["train", "--out", "OUT", "--cost-weight", "-0.5"], "'--cost-weight': -0.5", ">= 0"),
    (["train", "--out", "OUT", "--time-limit-s", "0"], "'--time-limit-s': 0.0", "> 0"),
    (["train", "--out", "OUT", "--seed", "-1"], "'--seed': -1", ">= 0"),
    (["plan", "DIR", "q", "--max-cost-usd", "-2"], "'--max-cost-usd': -2.0", "> 0"),
    (["pipeline", "run", "--local", "--grpo-steps", "-1"], "'--grpo-steps': -1", ">= 0"),
    (["pipeline", "run", "--local", "--sft-examples", "-1"], "'--sft-examples': -1", ">= 0"),
    (["pipeline", "run", "--local", "--train-limit", "-1"], "'--train-limit': -1", ">= 0"),
    (["pipeline", "run", "--local", "--eval-limit", "-1"], "'--eval-limit': -1", ">= 0"),
    (["pipeline", "run", "--local", "--cost-weight", "nan"], "'--cost-weight': nan", "finite"),
    (
        [
            "pipeline",
            "submit",
            "--host",
            "h",
            "--artifact-root",
            "s3://b",
            "--mlflow-tracking-uri",
            "u",
            "--grpo-steps",
            "-1",
        ],
        "'--grpo-steps': -1",
        ">= 0",
    ),
    (["registry", "promote", "--version", "0"], "'--version': 0", ">= 1"),
]


@pytest.mark.parametrize(("args", "bad", "valid"), OPTION_ROWS, ids=[" ".join(r[0]) for r in OPTION_ROWS])
def test_validated_options(args: list[str], bad: str, valid: str, tmp_path: Path) -> None:
    args = [str(tmp_path / a) if a in ("OUT", "DIR") else a for a in args]
    stderr = _fails(args, code=2, names=bad)
    assert valid in stderr
    assert "Try 'conductor " in stderr  # click's usage errors point at --help


def test_pipeline_parameters_follow_the_same_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """--set values reach the pipeline's own check (PARAMETER_RULES), before kfp starts."""
    from rl_conductor.pipeline import runner

    started: list[bool] = []
    monkeypatch.setattr(runner, "_local_root", lambda: started.append(True))  # the run's first step
    stderr = _fails(
        ["pipeline", "run", "--local", "--set", "min_accuracy=2"], code=2, names="min_accuracy: 2"
    )
    assert "a number in [0, 1]" in stderr
    _fails(["pipeline", "run", "--local", "--set", "max_cost_ratio=0"], code=2, names="max_cost_ratio: 0")
    _fails(["pipeline", "run", "--local", "--set", 'grpo_steps="many"'], code=2, names="'many'")
    assert started == []
    with pytest.raises(validation.InvalidValue, match="eval_limit"):
        runner.check_parameter("eval_limit", -1)
    assert runner.check_parameter("cost_weight", -1.0) == -1.0  # negative: the preset's weight


# -- library errors that reach the CLI ------------------------------------------------------------
def test_malformed_and_missing_pool_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers: [a\n  b: c\n")
    _fails(["pool", "show", str(bad)], code=2, names=f"pool file '{bad}' is not valid YAML: line 2")
    empty = tmp_path / "empty.yaml"
    empty.write_text("name: x\n")
    _fails(["pool", "show", str(empty)], code=2, names="non-empty `workers` list")
    _fails(["pool", "show", str(tmp_path / "missing.yaml")], code=2, names="no pool file at")


def test_unknown_dataset_split_and_policy_argument() -> None:
    stderr = _fails(["eval", "--policy", "random", "--dataset", "nods"], code=2, names="'nods'")
    assert "available: gsm8k" in stderr
    _fails(["eval", "--policy", "single"], code=2, names="policy 'single': single needs a worker name")
    stderr = _fails(
        ["eval", "--policy", "random", "--allowed-workers", "gpt-5,nobody"], code=2, names="'nobody'"
    )
    assert "it has ['gpt-5'" in stderr


def test_model_folder_without_a_conductor(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _fails(
        ["plan", str(tmp_path / "empty"), "q"], code=2, names="holds neither conductor.json nor config.json"
    )
    _fails(["plan", str(tmp_path / "nothing-here"), "q"], code=2, names=f"no Conductor model at {tmp_path}")
    for blank in ("", "  \n"):  # as serving answers 400 (it planned a fallback with exit 0)
        _fails(["plan", str(tmp_path / "empty"), blank], code=2, names="the question is blank")
    _fails(["plan", str(tmp_path / "empty"), "\udcff What is 3 plus 4?"], code=2, names="not valid UTF-8")


def test_registry_version_that_does_not_exist(
    mlflow_sqlite_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_sqlite_uri)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    stderr = _fails(
        ["eval", "--policy", "conductor:models:/no-such-model-h14/7", "--limit", "1"],
        code=2,
        names="no Conductor model at models:/no-such-model-h14/7",
    )
    assert "not found" in stderr
    _fails(
        [
            "registry",
            "promote",
            "--version",
            "7",
            "--name",
            "no-such-model-h14",
            "--mlflow-tracking-uri",
            mlflow_sqlite_uri,
        ],
        code=2,
        names="no-such-model-h14 has no version 7",
    )


def test_run_time_failures_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """A UserError that is not about usage (storage refused, a step failed) exits 1, one line."""
    from rl_conductor import storage
    from rl_conductor.workers import pool

    def refuse(*_: object, **__: object) -> None:
        raise storage.AccessDeniedError("access denied to s3://b/pools/p.yaml", "s3://b/pools/p.yaml")

    monkeypatch.setattr(pool, "load_pool", refuse)
    _fails(["pool", "show", "p"], code=1, names="s3://b/pools/p.yaml")


# -- debug, bugs, version --------------------------------------------------------------------------
def test_debug_flag_and_env_bring_the_traceback_back(monkeypatch: pytest.MonkeyPatch) -> None:
    result = runner.invoke(app, ["--debug", "eval", "--policy", "nonsense"])
    assert isinstance(result.exception, errors.UnknownName)  # propagated: typer prints the traceback
    assert result.exit_code == 1
    monkeypatch.setenv(DEBUG_ENV, "1")
    result = runner.invoke(app, ["eval", "--policy", "nonsense"])
    assert isinstance(result.exception, errors.UnknownName)
    monkeypatch.setenv(DEBUG_ENV, "0")
    _fails(["eval", "--policy", "nonsense"], code=2, names="'nonsense'")


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_conductor.workers import pool

    def broken() -> list[str]:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(pool, "available_pools", broken)
    result = runner.invoke(app, ["pool", "list"])
    assert isinstance(result.exception, ZeroDivisionError)
    assert result.exit_code == 1


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"conductor {version('rl-conductor')}"


def test_typer_exit_codes_pass_through() -> None:
    assert runner.invoke(app, ["--help"]).exit_code == 0
    assert runner.invoke(app, ["pool", "list"]).exit_code == 0
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[0] == "Error: No such command 'no-such-command'."


# -- the README's commands still parse ----------------------------------------------------------
def _readme_commands() -> list[list[str]]:
    """Every ``conductor …`` line of the README's bash blocks; ``[--flag]`` both ways, ``a | b``
    as two commands."""
    text = (ROOT / "README.md").read_text()
    out: list[list[str]] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if not line.startswith("conductor "):
                continue
            first, *rest = [part.strip() for part in line.split(" | ")]
            variants = [first] + [" ".join([*first.split()[:2], alt]) for alt in rest]
            for variant in variants:
                out.append(shlex.split(re.sub(r"\s*\[[^\]]*\]", "", variant))[1:])
                if "[" in variant:
                    out.append(shlex.split(variant.replace("[", "").replace("]", ""))[1:])
    return out


def _parse_only(args: list[str]) -> None:
    """Parse ``args`` down to the leaf command, running every option callback, invoking nothing."""
    command = typer.main.get_command(app)
    ctx = command.make_context("conductor", list(args))
    while hasattr(command, "resolve_command"):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]  # click keeps the command name apart
        name, command, rest = command.resolve_command(ctx, rest)
        assert command is not None, args
        ctx = command.make_context(name, rest, parent=ctx)


def test_readme_commands_parse() -> None:
    commands = _readme_commands()
    assert len(commands) >= 12, commands
    assert ["pool", "show", "paper-sim"] in commands
    for args in commands:
        _parse_only(args)


@pytest.mark.parametrize(
    "command",
    [
        ["pool", "calibrate", "--n", "10"],
        ["eval", "--policy", "single:gpt-5", "--limit", "2"],
        ["compare", "--limit", "2"],
        ["pool", "check", "paper-sim"],
    ],
    ids=["pool-calibrate", "eval", "compare", "pool-check"],
)
def test_json_into_a_path_that_cannot_be_written_is_one_line_before_any_work(
    tmp_path: Path, command: list[str]
) -> None:
    """Before: a traceback from the write, after the whole evaluation had run (pool check had
    its own check; every --json option now shares it: cli.options.writable_path)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for target in (blocker / "x.json", tmp_path):
        stderr = _fails(
            [*command, "--json", str(target)], code=2, names=f"--json {target}: cannot write there"
        )
        assert "Traceback" not in stderr


def test_train_warns_when_the_trained_model_writes_no_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose last GRPO step parsed almost no plan ends with a warning (its 0.000 reward curve
    alone read as a finished training)."""
    from types import SimpleNamespace

    import rl_conductor.training.train as training

    for parsed, warned in ((0.0, True), (0.98, False)):
        result = SimpleNamespace(
            reward_curve=[{"reward": 0.0, "conductor/parsed": parsed}], seconds={"total": 1.0}, global_step=1,
            final_dir=tmp_path / "final", sft_fit={},
        )  # fmt: skip
        monkeypatch.setattr(training, "train", lambda cfg, out, resume=False, r=result: r)
        res = CliRunner().invoke(app, ["train", "--out", str(tmp_path), "--grpo-steps", "1"])
        assert res.exit_code == 0, res.output
        assert ("warning: only 0 % of the last GRPO step's plans parsed" in res.output) is warned, res.output
