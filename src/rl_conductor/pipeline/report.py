"""The evaluation report of a pipeline run: Markdown, a self-contained HTML page, a Pareto PNG.

Why: the KFP UI renders Markdown and HTML artifacts in place, and the same files land in the
artifact root and in the registered model's MLflow run, so a person reading any of the three
sees the same comparison.

Simplifications: the HTML page embeds the PNG as a data URI (one file, no external assets) and
uses no template engine; the Markdown links the PNG by its file name, which resolves where the
files sit side by side (artifact root, MLflow run) but not inside the KFP viewer.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_conductor.evaluation.paired import paired_table_rows
from rl_conductor.evaluation.report import (
    BEHAVIOUR_COLUMNS,
    COLUMNS,
    behaviour_markdown,
    behaviour_rows,
    budget_markdown,
    budget_rows,
    deadline_markdown,
    deadline_plot,
    deadline_rows,
    markdown_table,
    paired_markdown,
    pareto_front,
    pareto_plot,
)

__all__ = ["html_report", "markdown_report", "write_reports"]

NOTE = (
    "Workers are simulated when the pool is a simulated one: the simulation cannot reward good "
    "instructions, only live workers can."
)


def _cell(fmt: str, value: Any) -> str:
    """A table cell as ``markdown_table`` writes it (accuracy in percent, ``-`` for missing)."""
    if value is None:
        return "-"
    return f"{100 * value:.1f}" if fmt == "{:.1%}" else fmt.format(value)


def _acting(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The policies whose behaviour is worth a table (a single worker always does the same)."""
    return [s for s in summaries if not str(s.get("policy", "")).startswith("single:")]


def _budgeted(
    summaries: Sequence[dict[str, Any]], budget_summaries: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The unbudgeted rows of the policies that also ran under a budget, then the budgeted rows."""
    names = {s["policy"] for s in budget_summaries}
    return [*(s for s in summaries if s["policy"] in names), *budget_summaries]


BEHAVIOUR_INTRO = (
    "Per domain: the share of steps each worker gets, mean steps, how often a step sees earlier "
    "answers (verifies or aggregates), and the share of questions per workflow shape."
)
BUDGET_INTRO = "The same test questions under each per-request budget (`max_cost_usd`), side by side."
PAIRED_INTRO = (
    "The Conductor minus each policy on the same test questions: the mean difference of each "
    "question's reward, accuracy and cost, with a 95 % paired bootstrap interval; `ahead` / `behind` "
    "where the reward interval excludes 0, else `tie`. The gate compares point estimates; this says "
    "how much of a margin is noise."
)
DEADLINE_INTRO = (
    "Latency vs accuracy: the same test questions under each per-request deadline (`max_latency_s`,"
    " seconds), side by side: accuracy, p95 critical-path latency, and the share of questions whose"
    " workflow the deadline cut short."
)


def _title(meta: Mapping[str, Any]) -> str:
    return f"Conductor evaluation: pool {meta.get('pool', '?')}, test split {meta.get('test_split_id', '?')}"


def markdown_report(
    summaries: Sequence[dict[str, Any]],
    meta: Mapping[str, Any],
    png_name: str = "pareto.png",
    budget_summaries: Sequence[dict[str, Any]] = (),
    deadline_summaries: Sequence[dict[str, Any]] = (),
    latency_png_name: str = "latency.png",
) -> str:
    """The comparison table, the Pareto front, what each policy does, the budget comparison
    (when ``budget_summaries`` holds runs under budgets), the latency-vs-accuracy view (when
    ``deadline_summaries`` holds runs under deadlines) and the run's identifiers as Markdown."""
    front = ", ".join(pareto_front(summaries))
    lines = [
        f"# {_title(meta)}",
        "",
        f"Run `{meta.get('run_tag', '')}`, {meta.get('n', '?')} test tasks.",
        "",
        markdown_table(summaries),
        "",
        f"**Pareto front (accuracy vs mean cost):** {front}",
        "",
        f"![cost vs accuracy]({png_name})",
        "",
        "## What each policy does",
        "",
        BEHAVIOUR_INTRO,
        "",
        behaviour_markdown(_acting(summaries)),
        "",
    ]
    if meta.get("paired"):
        lines += ["## Question by question", "", PAIRED_INTRO, "", paired_markdown(meta["paired"]), ""]
    if budget_summaries:
        lines += [
            "## Under a budget",
            "",
            BUDGET_INTRO,
            "",
            budget_markdown(_budgeted(summaries, budget_summaries)),
            "",
        ]
    if deadline_summaries:
        lines += [
            "## Under a deadline",
            "",
            DEADLINE_INTRO,
            "",
            deadline_markdown(_budgeted(summaries, deadline_summaries)),
            "",
            f"![accuracy under deadlines]({latency_png_name})",
            "",
        ]
    lines += [f"_{NOTE}_", ""]
    return "\n".join(lines)


def _html_table(heads: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def html_report(
    summaries: Sequence[dict[str, Any]],
    meta: Mapping[str, Any],
    png: bytes,
    budget_summaries: Sequence[dict[str, Any]] = (),
    deadline_summaries: Sequence[dict[str, Any]] = (),
    latency_png: bytes = b"",
) -> str:
    """A standalone HTML page: the same tables, the front, and the chart inlined."""
    front = set(pareto_front(summaries))
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in COLUMNS)
    rows = []
    for s in summaries:
        cells = "".join(f"<td>{html.escape(_cell(fmt, s.get(key)))}</td>" for key, _, fmt in COLUMNS)
        style = ' style="font-weight:bold"' if s["policy"] in front else ""
        rows.append(f"<tr{style}>{cells}</tr>")
    image = base64.b64encode(png).decode("ascii")
    title = html.escape(_title(meta))
    run_tag, n = html.escape(str(meta.get("run_tag", ""))), html.escape(str(meta.get("n", "?")))
    behaviour = _html_table(
        ["policy", "domain", *(h for h, _ in BEHAVIOUR_COLUMNS)], behaviour_rows(_acting(summaries))
    )
    extra = f"<h2>What each policy does</h2><p>{html.escape(BEHAVIOUR_INTRO)}</p>{behaviour}"
    if meta.get("paired"):
        heads, prows = paired_table_rows(meta["paired"])
        extra += f"<h2>Question by question</h2><p>{html.escape(PAIRED_INTRO)}</p>{_html_table(heads, prows)}"
    if budget_summaries:
        heads, brows = budget_rows(_budgeted(summaries, budget_summaries))
        extra += f"<h2>Under a budget</h2><p>{html.escape(BUDGET_INTRO)}</p>{_html_table(heads, brows)}"
    if deadline_summaries:
        heads, drows = deadline_rows(_budgeted(summaries, deadline_summaries))
        extra += f"<h2>Under a deadline</h2><p>{html.escape(DEADLINE_INTRO)}</p>{_html_table(heads, drows)}"
        if latency_png:
            data = base64.b64encode(latency_png).decode("ascii")
            extra += f"<p><img alt='accuracy under deadlines' src='data:image/png;base64,{data}'></p>"
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}</style>"
        f"</head><body><h1>{title}</h1>"
        f"<p>Run <code>{run_tag}</code>, {n} test tasks."
        " Bold rows are on the Pareto front.</p>"
        f"<table><tr>{head}</tr>{''.join(rows)}</table>"
        f"<p><img alt='cost vs accuracy' src='data:image/png;base64,{image}'></p>{extra}"
        f"<p><em>{html.escape(NOTE)}</em></p></body></html>\n"
    )


def write_reports(
    summaries: Sequence[dict[str, Any]],
    meta: Mapping[str, Any],
    *,
    md_path: str | os.PathLike[str],
    html_path: str | os.PathLike[str],
    png_path: str | os.PathLike[str],
    budget_summaries: Sequence[dict[str, Any]] = (),
    deadline_summaries: Sequence[dict[str, Any]] = (),
    latency_png_path: str | os.PathLike[str] | None = None,
) -> None:
    """Write the Pareto PNG (and, with ``deadline_summaries``, the latency-vs-accuracy PNG at
    ``latency_png_path``), then the Markdown and HTML reports that show them (local paths)."""
    title = f"(test, n={meta.get('n', '?')})"
    target = _draw(
        png_path,
        lambda p: pareto_plot(summaries, p, title=f"{meta.get('pool', '')}: cost vs accuracy {title}"),
    )
    latency = b""
    if deadline_summaries and latency_png_path is not None:
        rows = _budgeted(summaries, deadline_summaries)
        drawn = _draw(
            latency_png_path,
            lambda p: deadline_plot(
                rows, p, title=f"{meta.get('pool', '')}: accuracy under deadlines {title}"
            ),
        )
        latency = drawn.read_bytes()
    md = markdown_report(
        summaries, meta, budget_summaries=budget_summaries, deadline_summaries=deadline_summaries
    )
    page = html_report(summaries, meta, target.read_bytes(), budget_summaries, deadline_summaries, latency)
    for path, text in ((Path(md_path), md), (Path(html_path), page)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _draw(path: str | os.PathLike[str], draw: Any) -> Path:
    """Call ``draw(png_path)`` for ``path``; matplotlib appends ".png" to a name without a suffix
    (KFP artifact paths have none), so such a chart is drawn beside it and moved in place."""
    target = Path(path)
    drawn = target if target.suffix == ".png" else target.with_name(target.name + ".png")
    draw(drawn)
    if drawn != target:
        os.replace(drawn, target)
    return target
