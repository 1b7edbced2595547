"""Paired differences between policies evaluated on the same questions, with a 95 % interval.

Why: "does the Conductor beat my router on my recordings?" is a question about a difference of
two means measured on the same questions. Two summaries' means differ by noise too; a paired
comparison (each question's reward under policy A minus under policy B) cancels the questions'
own difficulty and is far tighter than comparing two unpaired intervals. ``conductor compare``
prints it for the first ``--policy`` against every other policy, and the pipeline's report for
the Conductor against the best baseline; both write it to their JSON.

What a summary carries for this (``question_columns``, the ``questions`` entry of every
evaluation summary): each question's id, whether it was answered correctly, its reward and its
cost, in the order of the evaluated task list (columns, not rows, to keep the JSON small).

The interval is a percentile bootstrap over questions (``n_boot`` draws, seeded, so a run is
reproducible): the same resampled questions for both policies, which is what makes it paired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: Bootstrap draws of a paired interval, and the seed that makes it reproducible.
N_BOOT = 2000
BOOT_SEED = 0
#: Fewest questions a verdict (ahead / behind / tie) is given on.
MIN_VERDICT_N = 20
#: Cost weights a router family is fitted at to trace its cost-accuracy frontier
#: (``evaluation.suite.run_frontier``, ``conductor compare --frontier``).
FRONTIER_WEIGHTS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


def question_columns(records: Sequence[Any]) -> dict[str, list[Any]]:
    """Per-question outcomes of an evaluation (:class:`~rl_conductor.evaluation.runner.Record`s) as
    columns: ``task_id``, ``correct`` (0/1), ``reward`` and ``cost_usd``."""
    return {
        "task_id": [r.task_id for r in records],
        "correct": [int(bool(r.correct)) for r in records],
        "reward": [round(float(r.reward), 9) for r in records],
        "cost_usd": [float(r.cost_usd) for r in records],
    }


class UnpairedError(ValueError):
    """Two summaries do not cover the same questions, so they cannot be compared question by question."""


def _aligned(
    a: Mapping[str, Any], b: Mapping[str, Any]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    qa, qb = a.get("questions"), b.get("questions")
    if not qa or not qb:
        raise UnpairedError("a summary has no per-question outcomes ('questions')")
    ids_a, ids_b = list(qa["task_id"]), list(qb["task_id"])
    if len(set(ids_a)) != len(ids_a) or set(ids_a) != set(ids_b) or len(ids_a) != len(ids_b):
        raise UnpairedError(
            f"{a.get('policy')!r} and {b.get('policy')!r} were not evaluated on the same questions "
            f"({len(ids_a)} and {len(ids_b)} questions)"
        )
    order = {t: i for i, t in enumerate(ids_b)}
    take = np.array([order[t] for t in ids_a], dtype=int)
    cols = ("correct", "reward", "cost_usd")
    return (
        {c: np.asarray(qa[c], dtype=float) for c in cols},
        {c: np.asarray(qb[c], dtype=float)[take] for c in cols},
    )


def paired_difference(
    a: Mapping[str, Any], b: Mapping[str, Any], *, n_boot: int = N_BOOT, seed: int = BOOT_SEED
) -> dict[str, Any]:
    """``a`` minus ``b`` on their common questions: mean reward, accuracy (points) and cost per
    question, each with a 95 % paired percentile-bootstrap interval, and how many questions only
    one of them got right (``only_a_right``: won by ``a``; ``only_b_right``: lost).

    Raises:
        UnpairedError: the two summaries were not evaluated on the same question ids.
    """
    xa, xb = _aligned(a, b)
    n = len(xa["reward"])
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(n_boot, n)) if n else np.zeros((0, 0), dtype=int)
    out: dict[str, Any] = {"policy": str(a.get("policy")), "against": str(b.get("policy")), "n": n}
    for key, column, scale in (
        ("reward", "reward", 1.0),
        ("accuracy_points", "correct", 100.0),
        ("cost_usd", "cost_usd", 1.0),
    ):
        d = (xa[column] - xb[column]) * scale
        boot = d[draws].mean(axis=1) if n else np.zeros(1)
        lo, hi = np.percentile(boot, [2.5, 97.5])
        out[key] = {"diff": float(d.mean()) if n else 0.0, "ci95": [float(lo), float(hi)]}
    out["only_a_right"] = int(((xa["correct"] == 1) & (xb["correct"] == 0)).sum())
    out["only_b_right"] = int(((xa["correct"] == 0) & (xb["correct"] == 1)).sum())
    return out


def verdict(row: Mapping[str, Any], key: str = "reward") -> str:
    """``ahead`` / ``behind`` when the 95 % interval of ``key`` excludes 0, else ``tie``; below
    :data:`MIN_VERDICT_N` questions ``too few questions``: a percentile interval over a handful of
    questions that all differ one way has no width, and would call one question a win."""
    if int(row.get("n", 0)) < MIN_VERDICT_N:
        return "too few questions"
    lo, hi = row[key]["ci95"]
    return "ahead" if lo > 0 else "behind" if hi < 0 else "tie"


def paired_rows(
    summaries: Sequence[Mapping[str, Any]], reference: str, *, n_boot: int = N_BOOT
) -> list[dict[str, Any]]:
    """The summary whose policy is ``reference`` minus every other policy's summary (summaries
    without per-question outcomes, and other summaries of that same policy name, are left out)."""
    ref = next((s for s in summaries if s.get("policy") == reference), None)
    if ref is None or not ref.get("questions"):
        return []
    rows = []
    for s in summaries:
        if s.get("policy") == reference or not s.get("questions"):
            continue
        row = paired_difference(ref, s, n_boot=n_boot)
        row["verdict"] = verdict(row)
        rows.append(row)
    return rows


def equal_cost_difference(
    reference: Mapping[str, Any],
    points: Sequence[Mapping[str, Any]],
    *,
    family: str = "",
    n_boot: int = N_BOOT,
    seed: int = BOOT_SEED,
) -> dict[str, Any]:
    """``reference``'s accuracy minus the accuracy that randomly mixing ``points`` reaches at
    ``reference``'s mean cost (the upper concave hull of their cost-accuracy points:
    :func:`rl_conductor.evaluation.frontier.hull_accuracy`), in points, with a 95 % paired
    bootstrap interval: each draw resamples the questions once and recomputes every point, the
    hull and the reference's cost on them. Where the reference is cheaper than every point
    (nothing on the frontier spends so little) it is compared with the cheapest point's accuracy,
    a credit to the frontier, not to the reference: every draw counts, so the interval is not
    made of the draws that happened to cost more, and ``below_frontier`` says so for the sample.

    Raises:
        UnpairedError: a summary was not evaluated on the reference's questions.
    """
    from rl_conductor.evaluation.frontier import Point, hull_accuracy

    cols = [_aligned(reference, p) for p in points]
    if not cols:
        raise UnpairedError("no frontier points to compare with")
    y0, c0 = cols[0][0]["correct"], cols[0][0]["cost_usd"]
    ys = np.stack([b["correct"] for _, b in cols])
    cs = np.stack([b["cost_usd"] for _, b in cols])
    n = len(y0)

    def frontier_at(idx: np.ndarray | slice) -> tuple[float, bool]:
        """The frontier's accuracy at the reference's cost on these questions, and whether the
        reference was cheaper than every point."""
        costs, accs = cs[:, idx].mean(1), ys[:, idx].mean(1)
        cost = float(c0[idx].mean())
        if cost < float(costs.min()) - 1e-15:
            return float(accs[costs == costs.min()].max()), True
        pts = [Point(str(k), float(c), float(y)) for k, (c, y) in enumerate(zip(costs, accs, strict=True))]
        return hull_accuracy(cost, pts), False

    out: dict[str, Any] = {
        "policy": str(reference.get("policy")),
        "against": family,
        "n": n,
        "points": len(points),
        "accuracy": float(y0.mean()) if n else 0.0,
        "mean_cost_usd": float(c0.mean()) if n else 0.0,
        "hull_accuracy": None,
        "below_frontier": False,
        "accuracy_points": None,
    }
    if not n:
        return out
    hull, below = frontier_at(slice(None))
    rng = np.random.default_rng(seed)
    draws = (rng.integers(0, n, size=n) for _ in range(n_boot))
    boots = [float(y0[idx].mean()) - frontier_at(idx)[0] for idx in draws]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    out.update(hull_accuracy=hull, below_frontier=below)
    out["accuracy_points"] = {
        "diff": 100 * (float(y0.mean()) - hull),
        "ci95": [100 * float(lo), 100 * float(hi)],
    }
    return out


def equal_cost_table_rows(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of an equal-cost table (one row per frontier family)."""
    head = [
        "frontier",
        "points",
        "acc %",
        "$/q",
        "frontier acc % at that cost",
        "points [95 % CI]",
        "accuracy",
    ]
    cells = []
    for r in rows:
        diff, hull = r["accuracy_points"], r["hull_accuracy"]
        at = "-" if hull is None else f"{100 * hull:.2f}"
        if r.get("below_frontier"):
            at += " (its cheapest point: every point costs more)"
        cells.append(
            [
                str(r["against"]),
                str(r["points"]),
                f"{100 * r['accuracy']:.2f}",
                f"{r['mean_cost_usd']:.3g}",
                at,
                "-" if diff is None else _ci(diff, "+.2f"),
                "-" if diff is None else verdict(r, "accuracy_points"),
            ]
        )
    return head, cells


def _ci(cell: Mapping[str, Any], fmt: str) -> str:
    lo, hi = cell["ci95"]
    return f"{cell['diff']:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def paired_table_rows(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of a paired-difference table (the CLI's rich table, the report's markdown)."""
    head = [
        "minus",
        "n",
        "reward diff [95 % CI]",
        "accuracy points [95 % CI]",
        "$/q diff",
        "questions won / lost",
        "reward",
    ]
    cells = [
        [
            str(r["against"]),
            str(r["n"]),
            _ci(r["reward"], "+.4f"),
            _ci(r["accuracy_points"], "+.2f"),
            f"{r['cost_usd']['diff']:+.3g}",
            f"{r['only_a_right']} / {r['only_b_right']}",
            str(r.get("verdict", verdict(r))),
        ]
        for r in rows
    ]
    return head, cells


__all__ = [
    "FRONTIER_WEIGHTS",
    "MIN_VERDICT_N",
    "N_BOOT",
    "UnpairedError",
    "equal_cost_difference",
    "equal_cost_table_rows",
    "paired_difference",
    "paired_rows",
    "paired_table_rows",
    "question_columns",
    "verdict",
]
