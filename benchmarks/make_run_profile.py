"""``make run``'s profile: each pipeline step's wall time, the training step's parts, and what the
run produced (the trained weights' sha256, the sha256 of ``results.json`` without its run tag,
the headline figures), from kfp local runner logs.

Why: fast feedback is measured per step (issue 27: ``make run`` in at most 8 minutes on 2
cores, with the same weights serial or parallel); the figures in the README and the closing
notes come from this script, not from reading logs by hand. Several logs are shown side by side
with their ratios to the first (for example the parallel build against
``RL_CONDUCTOR_TABLE_WORKERS=1``), and the weights and results of each are compared.

Inputs: kfp local runner logs (``<CONDUCTOR_HOME>/.conductor/kfp/logs/<timestamp>.log``, which
``conductor pipeline run --local`` writes; ``CONDUCTOR_HOME`` defaults to the current
directory); with none given, the newest there. ``--run`` first runs ``conductor pipeline run
--local --preset tiny`` (what ``make run`` runs) and profiles that run.

Usage: ``python benchmarks/make_run_profile.py [--run] [LOG ...] --json results/make_run_profile.json``
(from ``benchmarks/``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.table import Table

from rl_conductor.storage import conductor_home

_STAMP = r"(\d\d:\d\d:\d\d\.\d{3}) - INFO - "
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_START = re.compile(_STAMP + r"Executing task '([\w-]+)'")
_END = re.compile(_STAMP + r"Task '([\w-]+)' finished with status (\w+)")
_META = re.compile(r"metadata=(\{[^{}]*'seconds_total'[^{}]*\})")
_FOLDER = re.compile(r"run_folder: '([^']+)'")
#: the training step's parts (``train-conductor``'s output metadata), in the order they run
TRAIN_PARTS = ("seconds_bootstrap", "seconds_candidates", "seconds_sft", "seconds_grpo", "seconds_total")


def _clock(stamp: str) -> float:
    t = datetime.strptime(stamp, "%H:%M:%S.%f")
    return t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6


def _elapsed(start: float, end: float) -> float:
    return end - start if end >= start else end + 86400 - start  # a run across midnight


def profile(log: Path) -> dict[str, Any]:
    """Step times, training parts, weights sha256 and results of the run that wrote ``log``."""
    if not log.is_file():
        raise SystemExit(f"{log}: no such log file")
    text = _ANSI.sub("", log.read_text(errors="replace"))
    starts = {m.group(2): _clock(m.group(1)) for m in _START.finditer(text)}
    steps: dict[str, float] = {}
    status: dict[str, str] = {}
    for m in _END.finditer(text):
        name = m.group(2)
        if name in starts:
            steps[name] = round(_elapsed(starts[name], _clock(m.group(1))), 2)
            status[name] = m.group(3)
    if not steps:
        raise SystemExit(f"{log}: no finished kfp task in this log (is it a kfp local runner log?)")
    meta = _META.search(text)
    parts = _literal(meta.group(1)) if meta else {}
    out: dict[str, Any] = {
        "log": str(log),
        "steps_s": steps,
        "status": status,
        "pipeline_s": round(sum(steps.values()), 2),
        "train_parts_s": {k: round(float(parts[k]), 2) for k in TRAIN_PARTS if k in parts},
    }
    folder = _FOLDER.search(text)
    if folder:
        run = Path(folder.group(1))
        weights = run / "checkpoints" / "final" / "model.safetensors"
        if weights.is_file():
            out["weights_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
        results = run / "reports" / "results.json"
        if results.is_file():
            figures = json.loads(results.read_text())
            out["results_sha256"] = _figures_sha256(figures)
            out["results"] = _headline(figures)
    return out


def _literal(text: str) -> dict[str, Any]:
    """The logged metadata dict; ``nan`` / ``inf`` (a diverged reward) read as floats."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        text = re.sub(r"\b(nan|inf)\b", lambda m: f"'{m.group(1)}'", text)
        value = {k: float(v) for k, v in ast.literal_eval(text).items()}
    return value if isinstance(value, dict) else {}


def _figures_sha256(results: dict[str, Any]) -> str:
    """sha256 of ``results.json`` without its run tag (the run's timestamp, the one field two runs
    of the same code always differ in)."""
    meta = {k: v for k, v in (results.get("meta") or {}).items() if k != "run_tag"}
    body = json.dumps({**results, "meta": meta}, sort_keys=True).encode()
    return hashlib.sha256(body).hexdigest()


def _headline(results: dict[str, Any]) -> dict[str, Any]:
    """Accuracy, cost and reward of each policy in ``results.json`` (its ``results`` rows)."""
    rows = results.get("results") or []
    keep = ("accuracy", "mean_cost_usd", "mean_reward")
    return {str(r.get("policy")): {k: r.get(k) for k in keep if k in r} for r in rows if isinstance(r, dict)}


def run_pipeline() -> tuple[Path, float]:
    """``conductor pipeline run --local --preset tiny`` (``make run``'s command); its log and wall s."""
    logs_dir = _logs_dir()
    before = set(logs_dir.glob("*.log"))
    conductor = Path(sys.executable).with_name("conductor")
    t0 = time.perf_counter()
    subprocess.run([str(conductor), "pipeline", "run", "--local", "--preset", "tiny"], check=True)
    wall = time.perf_counter() - t0
    new = sorted(set(logs_dir.glob("*.log")) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        raise SystemExit(f"the pipeline ran but wrote no log under {logs_dir}")
    return new[-1], wall


def _logs_dir() -> Path:
    """Where ``conductor pipeline run --local`` writes its logs (``pipeline.runner._local_root``)."""
    return conductor_home() / ".conductor" / "kfp" / "logs"


def newest_log() -> Path:
    logs = sorted(_logs_dir().glob("*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        raise SystemExit(f"no kfp local runner log under {_logs_dir()}: run `make run` first")
    return logs[-1]


def show(runs: list[dict[str, Any]]) -> None:
    table = Table(title="make run, per step (s; ratio to the first run)")
    table.add_column("step")
    for k in range(len(runs)):
        table.add_column(f"run {k + 1}" if k == 0 else f"run {k + 1} (ratio)", justify="right")
    names = list(dict.fromkeys(n for r in runs for n in r["steps_s"]))
    rows = [(n, [r["steps_s"].get(n) for r in runs]) for n in names]
    rows += [
        (f"  {p.removeprefix('seconds_')}", [r["train_parts_s"].get(p) for r in runs]) for p in TRAIN_PARTS
    ]
    rows.append(("pipeline", [r["pipeline_s"] for r in runs]))
    for name, values in rows:
        first = values[0]
        cells = []
        for k, v in enumerate(values):
            if v is None:
                cells.append("-")
            elif k == 0 or not first:
                cells.append(f"{v:.1f}")
            else:
                cells.append(f"{v:.1f} ({v / first:.2f})")
        table.add_row(name, *cells)
    console = Console()
    console.print(table)
    for k, r in enumerate(runs):
        weights, results = r.get("weights_sha256", "?")[:16], r.get("results_sha256", "?")[:16]
        console.print(f"run {k + 1}: weights {weights}…  results.json {results}…")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="*", type=Path, help="kfp local runner logs (default: the newest)")
    ap.add_argument("--run", action="store_true", help="run the pipeline first (make run's command)")
    ap.add_argument("--labels", default="", help="comma-separated names of the runs, in order")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    logs = list(args.logs)
    wall = None
    if args.run:
        log, wall = run_pipeline()
        logs.append(log)
    runs = [profile(p) for p in (logs or [newest_log()])]
    if wall is not None:
        runs[-1]["command_wall_s"] = round(wall, 2)
    for run, label in zip(runs, [x.strip() for x in args.labels.split(",") if x.strip()], strict=False):
        run["label"] = label
    show(runs)
    same = {
        key: len({r.get(key) for r in runs}) == 1 and runs[0].get(key) is not None
        for key in ("weights_sha256", "results_sha256")
    }
    if args.json:
        write_json(args.json, "make_run_profile", {"runs": runs, "identical": same})
    failed = [n for r in runs for n, s in r["status"].items() if s != "SUCCESS"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
