"""Tables and pictures of evaluation summaries: a rich table, Markdown, and a Pareto chart."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

COLUMNS = [
    ("policy", "policy", "{}"),
    ("n", "n", "{}"),
    ("accuracy", "accuracy %", "{:.1%}"),
    ("mean_tokens", "tokens", "{:,.0f}"),
    ("mean_cost_usd", "cost $", "{:.5f}"),
    ("mean_calls", "calls", "{:.2f}"),
    ("p50_latency_s", "p50 s", "{:.1f}"),
    ("p95_latency_s", "p95 s", "{:.1f}"),
    ("mean_reward", "reward", "{:.4f}"),
    ("failed_call_rate", "failed calls %", "{:.1%}"),
    ("multi_round_rate", "rounds>1 %", "{:.1%}"),
]
#: shown only when a policy reads a ranking line (``evidence: rank``): how often it followed it
AGREEMENT = ("evidence_agreement", "follows evidence %", "{:.1%}")


def _columns(summaries: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [*COLUMNS, AGREEMENT] if any(AGREEMENT[0] in s for s in summaries) else COLUMNS


def _fmt(fmt: str, v: Any) -> str:
    if v is None:
        return "-"
    if fmt == "{:.1%}":
        return f"{100 * v:.1f}"
    return fmt.format(v)


def rich_table(summaries: Sequence[dict[str, Any]], title: str = "") -> Table:
    table = Table(title=title or None)
    columns = _columns(summaries)
    for _, header, _ in columns:
        if header == "policy":
            table.add_column(header, justify="left", no_wrap=True)
        else:
            table.add_column(header, justify="right")
    for s in summaries:
        table.add_row(*(_fmt(fmt, s.get(key)) for key, _, fmt in columns))
    return table


def print_table(summaries: Sequence[dict[str, Any]], title: str = "", console: Console | None = None) -> None:
    # off a terminal (CI logs, pipes, a file) the table's own width: a fixed 130 columns cut the
    # figures of a comparison with long policy names to "0.000…" (a cascade's name is its workers)
    (console or Console(width=None if Console().is_terminal else 10_000)).print(rich_table(summaries, title))


def domain_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"{summary.get('policy')} by domain")
    for _, header, _ in COLUMNS:
        table.add_column("domain" if header == "policy" else header, justify="right")
    for d, s in summary.get("by_domain", {}).items():
        table.add_row(*(d if key == "policy" else _fmt(fmt, s.get(key)) for key, _, fmt in COLUMNS))
    return table


def markdown_table(summaries: Sequence[dict[str, Any]]) -> str:
    columns = _columns(summaries)
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "|" + "|".join("---" if k == "policy" else "---:" for k, _, _ in columns) + "|"
    rows = ["| " + " | ".join(_fmt(f, s.get(k)) for k, _, f in columns) + " |" for s in summaries]
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


COST_AXIS = "mean cost per question (USD, log scale)"


@contextmanager
def _figure(path: str | Path, title: str, xlabel: str) -> Iterator[Any]:
    """The axes of one 8 x 5.5 in chart of accuracy (y) against ``xlabel``, titled and gridded,
    written to ``path`` as a PNG when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    try:
        yield ax
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy (%)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(Path(path))
    finally:
        plt.close(fig)


def pareto_plot(
    summaries: Sequence[dict[str, Any]], path: str | Path, title: str = "Cost vs accuracy"
) -> Path:
    """Scatter of mean cost (log x) vs accuracy with the Pareto front drawn; writes a PNG."""
    front = set(pareto_front(summaries))
    with _figure(path, title, COST_AXIS) as ax:
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
    return Path(path)


# --------------------------------------------------------------------------- behaviour


def _top(shares: dict[str, float] | None, n: int = 3) -> str:
    """``a 92%, b 8%``: the ``n`` largest shares, then ``+k more``."""
    if not shares:
        return "-"
    items = sorted(shares.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} {100 * v:.0f}%" for k, v in items[:n])
    return text + (f", +{len(items) - n} more" if len(items) > n else "")


#: Columns of the behaviour view: (header, function of a per-domain summary).
BEHAVIOUR_COLUMNS: list[tuple[str, Any]] = [
    ("n", lambda s: str(s.get("n", 0))),
    ("acc %", lambda s: _fmt("{:.1%}", s.get("accuracy"))),
    ("steps", lambda s: _fmt("{:.2f}", s.get("mean_steps"))),
    ("verify %", lambda s: _fmt("{:.1%}", s.get("verify_rate"))),
    ("workers called", lambda s: _top(s.get("worker_shares"))),
    ("workflow shapes", lambda s: _top(s.get("shapes"))),
]


def behaviour_rows(summaries: Sequence[dict[str, Any]]) -> list[list[str]]:
    """One row per (policy, domain) and an ``all`` row per policy: what the policy does there."""
    rows = []
    for s in summaries:
        label = s["policy"] + (f" @ {s['budget']}" if s.get("budget") not in (None, "none") else "")
        for domain, d in [("all", s), *s.get("by_domain", {}).items()]:
            rows.append([label, domain, *(fn(d) for _, fn in BEHAVIOUR_COLUMNS)])
    return rows


def behaviour_table(summaries: Sequence[dict[str, Any]], title: str = "what each policy does") -> Table:
    table = Table(title=title)
    table.add_column("policy", no_wrap=True)
    table.add_column("domain")
    for header, _ in BEHAVIOUR_COLUMNS:
        table.add_column(header, justify="left" if header.startswith(("workers", "workflow")) else "right")
    for row in behaviour_rows(summaries):
        table.add_row(*row)
    return table


def behaviour_markdown(summaries: Sequence[dict[str, Any]]) -> str:
    heads = ["policy", "domain", *(h for h, _ in BEHAVIOUR_COLUMNS)]
    lines = ["| " + " | ".join(heads) + " |", "|---|---|" + "---:|" * 4 + "---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in behaviour_rows(summaries)]
    return "\n".join(lines)


# --------------------------------------------------------------------------- budgets


def limit_label(value: float | None) -> str:
    """``none`` for no limit, else the value as written (``0.002``, ``15``)."""
    return "none" if value is None else f"{value:g}"


budget_label = limit_label
deadline_label = limit_label


def _parse_limits(text: str, name: str, example: str, unit: str = "") -> list[float | None]:
    """``none,a,b`` → ``[None, a, b]`` (duplicates dropped), each a finite number > 0; ``unit``
    may follow a number (``15s``). Bad values raise the shared validation error naming them."""
    from rl_conductor.validation import positive_finite

    out: list[float | None] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part.lower() == "none":
            out.append(None)
            continue
        try:
            value = float(part.removesuffix(unit) if unit else part)
        except ValueError:
            value = part  # type: ignore[assignment]  # positive_finite names the bad value
        out.append(positive_finite(name, value))
    if not out:
        raise ValueError(f"no {name}s in {text!r}: write e.g. {example}")
    return list(dict.fromkeys(out))


def parse_budgets(text: str) -> list[float | None]:
    """``none,0.002`` → ``[None, 0.002]``; each amount a finite number > 0."""
    return _parse_limits(text, "budget", "none,0.002")


Column = tuple[str, Callable[[dict[str, Any]], str]]


def _side_by_side(
    summaries: Sequence[dict[str, Any]], key: str, columns: Sequence[Column]
) -> tuple[list[str], list[list[str]]]:
    """One row per policy, ``columns`` repeated for each value of ``key`` (budget, deadline)."""
    values = list(dict.fromkeys(str(s.get(key, "none")) for s in summaries))
    by_policy: dict[str, dict[str, dict[str, Any]]] = {}
    for s in summaries:
        by_policy.setdefault(s["policy"], {})[str(s.get(key, "none"))] = s
    heads = ["policy"] + [f"{head} @{v}" for v in values for head, _ in columns]
    rows = [
        [policy] + [cell(per.get(v, {})) for v in values for _, cell in columns]
        for policy, per in by_policy.items()
    ]
    return heads, rows


def _rich(heads: list[str], rows: list[list[str]], title: str, left: tuple[str, ...]) -> Table:
    table = Table(title=Text(title))  # a title naming a policy is not markup: `single:b:` is no emoji
    for h in heads:
        table.add_column(h, no_wrap=h == "policy", justify="left" if h.startswith(left) else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _markdown(heads: list[str], rows: list[list[str]], left: tuple[str, ...]) -> str:
    sep = "|" + "|".join("---" if h.startswith(left) else "---:" for h in heads) + "|"
    return "\n".join(["| " + " | ".join(heads) + " |", sep, *("| " + " | ".join(r) + " |" for r in rows)])


_BUDGET_COLUMNS: tuple[Column, ...] = (
    ("acc %", lambda s: _fmt("{:.1%}", s.get("accuracy"))),
    ("cost $", lambda s: _fmt("{:.5f}", s.get("mean_cost_usd"))),
    ("workers", lambda s: _top(s.get("worker_shares"), 2)),
)
_BUDGET_LEFT = ("policy", "workers")


def budget_rows(summaries: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Per policy, accuracy / cost / workers chosen under each budget, side by side."""
    return _side_by_side(summaries, "budget", _BUDGET_COLUMNS)


def budget_table(
    summaries: Sequence[dict[str, Any]], title: str = "the same questions under each budget"
) -> Table:
    return _rich(*budget_rows(summaries), title, _BUDGET_LEFT)


def budget_markdown(summaries: Sequence[dict[str, Any]]) -> str:
    return _markdown(*budget_rows(summaries), _BUDGET_LEFT)


def budget_plot(
    summaries: Sequence[dict[str, Any]], path: str | Path, title: str = "Accuracy under budgets"
) -> Path:
    """Cost (log x) vs accuracy, one marker per budget and a line joining each policy's points."""
    budgets = list(dict.fromkeys(str(s.get("budget", "none")) for s in summaries))
    markers = "os^Dvx*"
    with _figure(path, title, COST_AXIS) as ax:
        by_policy: dict[str, list[dict[str, Any]]] = {}
        for s in summaries:
            by_policy.setdefault(s["policy"], []).append(s)
        for i, (policy, points) in enumerate(by_policy.items()):
            xy = [(max(p["mean_cost_usd"], 1e-6), 100 * p["accuracy"]) for p in points]
            ax.plot([x for x, _ in xy], [y for _, y in xy], "-", color=f"C{i % 10}", lw=0.8, alpha=0.6)
            for p, (x, y) in zip(points, xy, strict=True):
                b = str(p.get("budget", "none"))
                ax.scatter(
                    x, y, marker=markers[budgets.index(b) % len(markers)], color=f"C{i % 10}", zorder=3
                )
            ax.annotate(policy, xy[-1], fontsize=7, xytext=(4, 3), textcoords="offset points")
        for j, b in enumerate(budgets):
            ax.scatter([], [], marker=markers[j % len(markers)], color="k", label=f"budget {b}")
        ax.legend(loc="lower right", fontsize=8)
        ax.set_xscale("log")
    return Path(path)


# --------------------------------------------------------------------------- deadlines


def parse_deadlines(text: str) -> list[float | None]:
    """``none,60,15,5`` → ``[None, 60.0, 15.0, 5.0]``; each deadline a finite number of seconds > 0."""
    return _parse_limits(text, "deadline", "none,60,15,5", unit="s")


_DEADLINE_COLUMNS: tuple[Column, ...] = (
    ("acc %", lambda s: _fmt("{:.1%}", s.get("accuracy"))),
    ("p95 s", lambda s: _fmt("{:.1f}", s.get("p95_latency_s"))),
    (
        "cut %",
        lambda s: _fmt(
            "{:.0f}", None if s.get("deadline_cut_rate") is None else 100 * s["deadline_cut_rate"]
        ),
    ),
)


def deadline_rows(summaries: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Per policy, accuracy / p95 critical-path latency / share of questions the deadline cut,
    under each deadline, side by side."""
    return _side_by_side(summaries, "deadline", _DEADLINE_COLUMNS)


def deadline_table(
    summaries: Sequence[dict[str, Any]], title: str = "the same questions under each deadline (s)"
) -> Table:
    return _rich(*deadline_rows(summaries), title, ("policy",))


def deadline_markdown(summaries: Sequence[dict[str, Any]]) -> str:
    return _markdown(*deadline_rows(summaries), ("policy",))


def deadline_plot(
    summaries: Sequence[dict[str, Any]], path: str | Path, title: str = "Accuracy under deadlines"
) -> Path:
    """Latency-vs-accuracy view: deadline (log x; no deadline drawn at the right edge, labelled
    ``none``) vs accuracy, one line per policy."""
    labels = list(dict.fromkeys(str(s.get("deadline", "none")) for s in summaries))
    finite = sorted(float(d) for d in labels if d != "none")
    none_x = (finite[-1] * 2.5) if finite else 1.0
    with _figure(path, title, "deadline per request (s, log scale)") as ax:
        by_policy: dict[str, list[dict[str, Any]]] = {}
        for s in summaries:
            by_policy.setdefault(s["policy"], []).append(s)
        for i, (policy, points) in enumerate(by_policy.items()):
            xy = sorted(
                (
                    none_x if str(p.get("deadline", "none")) == "none" else float(p["deadline"]),
                    100 * p["accuracy"],
                )
                for p in points
            )
            style = ("-", "--", ":")[i // 10 % 3]  # ten colours, then the same colours dashed
            ax.plot(
                [x for x, _ in xy],
                [y for _, y in xy],
                marker="o",
                ls=style,
                color=f"C{i % 10}",
                lw=1,
                ms=4,
                label=policy,
            )
        ticks = [*finite, none_x] if finite else [none_x]
        ax.set_xscale("log")
        ax.set_xticks(ticks)
        ax.set_xticklabels([*(f"{t:g}" for t in finite), "none"])
        ax.minorticks_off()
        ax.legend(loc="lower right", fontsize=7)
    return Path(path)


_PAIRED_LEFT = ("minus", "reward")


def paired_table(rows: Sequence[dict[str, Any]], reference: str) -> Table:
    """:func:`rl_conductor.evaluation.paired.paired_rows` as a rich table: ``reference`` minus each
    policy, question by question (95 % paired bootstrap intervals)."""
    from rl_conductor.evaluation.paired import paired_table_rows

    return _rich(
        *paired_table_rows(rows), f"{reference} minus each policy, on the same questions", _PAIRED_LEFT
    )


def paired_markdown(rows: Sequence[dict[str, Any]]) -> str:
    from rl_conductor.evaluation.paired import paired_table_rows

    return _markdown(*paired_table_rows(rows), _PAIRED_LEFT)


def equal_cost_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    """:func:`rl_conductor.evaluation.paired.equal_cost_difference` rows as a rich table."""
    from rl_conductor.evaluation.paired import equal_cost_table_rows

    return _rich(*equal_cost_table_rows(rows), title, ("frontier", "accuracy"))
