"""Tables and pictures of evaluation summaries: a rich table, Markdown, and a Pareto chart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

COLUMNS = [
    ("policy", "policy", "{}"),
    ("n", "n", "{}"),
    ("accuracy", "accuracy %", "{:.1%}"),
    ("mean_tokens", "tokens", "{:,.0f}"),
    ("mean_cost_usd", "cost $", "{:.5f}"),
    ("mean_calls", "calls", "{:.2f}"),
    ("p50_latency_s", "p50 s", "{:.1f}"),
    ("p95_latency_s", "p95 s", "{:.1f}"),
]


def _fmt(fmt: str, v: Any) -> str:
    if v is None:
        return "-"
    if fmt == "{:.1%}":
        return f"{100 * v:.1f}"
    return fmt.format(v)


def rich_table(summaries: Sequence[dict[str, Any]], title: str = "") -> Table:
    table = Table(title=title or None)
    for _, header, _ in COLUMNS:
        if header == "policy":
            table.add_column(header, justify="left", no_wrap=True)
        else:
            table.add_column(header, justify="right")
    for s in summaries:
        table.add_row(*(_fmt(fmt, s.get(key)) for key, _, fmt in COLUMNS))
    return table


def print_table(summaries: Sequence[dict[str, Any]], title: str = "", console: Console | None = None) -> None:
    # a fixed width when not on a terminal (CI logs, pipes) so policy names are not cut
    (console or Console(width=None if Console().is_terminal else 130)).print(rich_table(summaries, title))


def domain_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"{summary.get('policy')} by domain")
    for _, header, _ in COLUMNS:
        table.add_column("domain" if header == "policy" else header, justify="right")
    for d, s in summary.get("by_domain", {}).items():
        table.add_row(*(d if key == "policy" else _fmt(fmt, s.get(key)) for key, _, fmt in COLUMNS))
    return table


def markdown_table(summaries: Sequence[dict[str, Any]]) -> str:
    head = "| " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    sep = "|" + "|".join("---" if k == "policy" else "---:" for k, _, _ in COLUMNS) + "|"
    rows = ["| " + " | ".join(_fmt(f, s.get(k)) for k, _, f in COLUMNS) + " |" for s in summaries]
    return "\n".join([head, sep, *rows])


def pareto_front(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """Policies not dominated in (higher accuracy, lower cost)."""
    front = []
    for s in summaries:
        dominated = any(
            o is not s
            and o["accuracy"] >= s["accuracy"]
            and o["mean_cost_usd"] <= s["mean_cost_usd"]
            and (o["accuracy"] > s["accuracy"] or o["mean_cost_usd"] < s["mean_cost_usd"])
            for o in summaries
        )
        if not dominated:
            front.append(s["policy"])
    return front


def pareto_plot(
    summaries: Sequence[dict[str, Any]], path: str | Path, title: str = "Cost vs accuracy"
) -> Path:
    """Scatter of mean cost (log x) vs accuracy with the Pareto front drawn; writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    front = set(pareto_front(summaries))
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    for s in summaries:
        on = s["policy"] in front
        is_cond = s["policy"].startswith("conductor")
        ax.scatter(
            max(s["mean_cost_usd"], 1e-6),
            100 * s["accuracy"],
            s=90 if is_cond else 45,
            marker="*" if is_cond else "o",
            color="C3" if is_cond else ("C0" if on else "C7"),
            zorder=3,
        )
        ax.annotate(
            s["policy"],
            (max(s["mean_cost_usd"], 1e-6), 100 * s["accuracy"]),
            fontsize=7,
            xytext=(4, 3),
            textcoords="offset points",
        )
    pts = sorted(
        (max(s["mean_cost_usd"], 1e-6), 100 * s["accuracy"]) for s in summaries if s["policy"] in front
    )
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "--", color="C0", lw=1, label="Pareto front")
        ax.legend(loc="lower right")
    ax.set_xscale("log")
    ax.set_xlabel("mean cost per question (USD, log scale)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
