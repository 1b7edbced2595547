"""The benchmarks that ship inside the package, registered as datasets.

The data lies in ``rl_conductor/data/tasks/*.jsonl.gz`` (licences in ``data/DATA_LICENSES.md``),
so loading needs no network and no files outside the package. ``llmrouter``'s own train and test
files are merged (and de-duplicated) first.

* ``math500`` (math / ``math``), ``gsm8k`` (math / ``math``, test file only),
  ``mmlu_stem`` (knowledge / ``choice``), ``mbpp`` and ``humaneval`` (code / ``code``);
* ``llmrouter``: LLMRouter's mixed query set, see :func:`load_llmrouter` for the mapping of its
  13 task types and for the rows it drops;
* ``paper-mix``: the paper's four in-domain benchmarks (MATH500, MMLU, RLPR, LiveCodeBench),
  approximated by math500, mmlu_stem, llmrouter's reasoning rows and mbpp + humaneval, each
  domain capped at ``PAPER_MIX_DOMAIN_CAP`` tasks so averages weigh domains alike.
"""

from __future__ import annotations

import ast
import functools
import gzip
import json
import re
from importlib import resources
from typing import Any

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.registry import hash_fraction, load_tasks, register_dataset

#: No domain of ``paper-mix`` holds more tasks than this.
PAPER_MIX_DOMAIN_CAP = 800


# --------------------------------------------------------------------------- file access and helpers


@functools.cache
def read_jsonl(filename: str) -> tuple[dict[str, Any], ...]:
    """Rows of ``rl_conductor/data/tasks/<filename>`` (gzipped JSON lines), cached."""
    ref = resources.files("rl_conductor").joinpath("data", "tasks", filename)
    with ref.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def format_choices(question: str, choices: list[str]) -> str:
    """The question followed by lettered options ("A. ...\\nB. ...")."""
    lines = [f"{chr(ord('A') + i)}. {c}" for i, c in enumerate(choices)]
    return question.rstrip() + "\n\n" + "\n".join(lines)


def _gsm8k_gold(solution: str) -> str | None:
    m = re.search(r"####\s*(.+)\s*$", solution.strip())
    return m.group(1).replace(",", "").strip() if m else None


def _boxed_gold(solution: str) -> str | None:
    from rl_conductor.tasks.graders import last_boxed

    return last_boxed(solution)


def _entry_point(header: str) -> str:
    m = re.search(r"def\s+([A-Za-z_]\w*)\s*\(", header)
    return m.group(1) if m else ""


def _mbpp_question(prompt: str, tests: list[str]) -> str:
    return prompt.strip() + "\nYour code should pass these tests:\n\n" + "\n".join(tests)


def _humaneval_question(prompt: str) -> str:
    return "Complete the following Python function.\n\n```python\n" + prompt + "```"


# --------------------------------------------------------------------------- single-source datasets


@register_dataset("math500")
def load_math500() -> list[Task]:
    """MATH-500 (Lightman et al.'s subset of MATH): level 1-5, subject, ref_len (solution chars)."""
    return [
        Task(
            id=f"math500/{i}",
            question=r["problem"],
            answer=r["answer"],
            domain="math",
            source="math500",
            grader="math",
            metadata={"level": int(r["level"]), "subject": r["subject"], "ref_len": len(r["solution"])},
        )
        for i, r in enumerate(read_jsonl("math500_test.jsonl.gz"))
    ]


@register_dataset("gsm8k")
def load_gsm8k() -> list[Task]:
    """GSM8K test set; the gold is the number after ``####`` in the reference solution."""
    tasks = []
    for i, r in enumerate(read_jsonl("gsm8k_test.jsonl.gz")):
        gold = _gsm8k_gold(r["answer"])
        if gold is None:
            continue
        tasks.append(
            Task(
                id=f"gsm8k/{i}",
                question=r["question"],
                answer=gold,
                domain="math",
                source="gsm8k",
                grader="math",
                metadata={"ref_len": len(r["answer"])},
            )
        )
    return tasks


@register_dataset("mmlu_stem")
def load_mmlu_stem() -> list[Task]:
    """MMLU STEM subjects; the question lists its lettered options, the gold is the letter."""
    tasks = []
    for i, r in enumerate(read_jsonl("mmlu_stem_test.jsonl.gz")):
        choices = [str(c) for c in r["choices"]]
        tasks.append(
            Task(
                id=f"mmlu_stem/{i}",
                question=format_choices(r["question"], choices),
                answer="ABCDEFGHIJ"[int(r["answer"])],
                domain="knowledge",
                source="mmlu_stem",
                grader="choice",
                metadata={"choices": choices, "subject": r["type"]},
            )
        )
    return tasks


def _mbpp_task(task_id: str, source: str, prompt: str, row: dict[str, Any]) -> Task:
    tests = [str(t) for t in row["test_list"]]
    return Task(
        id=task_id,
        question=_mbpp_question(prompt, tests),
        answer=row["code"],
        domain="code",
        source=source,
        grader="code",
        metadata={
            "tests": tests,
            "test_imports": [str(t) for t in row.get("test_imports") or []],
            "entry_point": _entry_point(row.get("code_header") or row["code"]),
            "prompt": prompt,
            "ref_len": len(row["code"]),
        },
    )


#: Rows left out at load time, with the reason. Every other row's reference answer grades as
#: correct (checked for all rows when this list was written; tests/test_tasks.py re-checks samples).
EXCLUDED_IDS: dict[str, str] = {
    # amicable_numbers_sum: the reference is O(n^2) up to 9,999 and needs ~10 s of CPU, beyond
    # graders.CODE_TIMEOUT_S; correct solutions would be graded wrong by the timeout.
    "mbpp/64": "reference solution exceeds the code grading timeout",
}


@register_dataset("mbpp")
def load_mbpp() -> list[Task]:
    """MBPP (sanitized) test set: tests are assert statements, gold is the reference code."""
    return [
        _mbpp_task(f"mbpp/{i}", "mbpp", r["prompt"], r)
        for i, r in enumerate(read_jsonl("mbpp_sanitized_test.jsonl.gz"))
        if f"mbpp/{i}" not in EXCLUDED_IDS
    ]


def _humaneval_task(task_id: str, source: str, row: dict[str, Any]) -> Task:
    gold = row["prompt"] + row["canonical_solution"]
    return Task(
        id=task_id,
        question=_humaneval_question(row["prompt"]),
        answer=gold,
        domain="code",
        source=source,
        grader="code",
        metadata={
            "tests": row["test"],
            "entry_point": row["entry_point"],
            "prompt": row["prompt"],
            "ref_len": len(row["canonical_solution"]),
        },
    )


@register_dataset("humaneval")
def load_humaneval() -> list[Task]:
    """HumanEval: tests are its ``check(candidate)`` code, gold is prompt + canonical solution."""
    return [
        _humaneval_task("humaneval/" + r["task_id"].split("/")[-1], "humaneval", r)
        for r in read_jsonl("humaneval_test.jsonl.gz")
    ]


# --------------------------------------------------------------------------- llmrouter (mixed)

#: LLMRouter task_name -> (domain, grader). ``commongen`` is absent on purpose (see loader).
LLMROUTER_TASKS: dict[str, tuple[str, str]] = {
    "math": ("math", "math"),
    "gsm8k": ("math", "math"),
    "agentverse-mgsm": ("math", "math"),
    "mmlu": ("knowledge", "choice"),
    "arc_challenge": ("knowledge", "choice"),
    "openbook_qa": ("knowledge", "choice"),
    "natural_qa": ("knowledge", "qa"),
    "trivia_qa": ("knowledge", "qa"),
    "commonsense_qa": ("reasoning", "choice"),
    "agentverse-logicgrid": ("reasoning", "choice"),
    "mbpp": ("code", "code"),
    "human_eval": ("code", "code"),
}


def _parse_choices(raw: Any, gold: str) -> tuple[list[str], str] | None:
    """LLMRouter choices (a list, or a dict of text + label(s), stored as a repr) -> (texts, letter)."""
    try:
        value = ast.literal_eval(raw) if isinstance(raw, str) else raw
    except (ValueError, SyntaxError):
        return None
    if isinstance(value, dict):
        texts = [str(t) for t in value.get("text", [])]
        labels = [str(x) for x in value.get("label") or value.get("labels") or []]
        if len(labels) != len(texts) or gold not in labels:
            return None
        return texts, "ABCDEFGHIJ"[labels.index(gold)]
    if isinstance(value, list | tuple):
        texts = [str(t) for t in value]
        idx = "ABCDEFGHIJ".find(gold)
        if not 0 <= idx < len(texts):
            return None
        return texts, gold
    return None


def _llmrouter_row(task_id: str, r: dict[str, Any], refs: dict[str, Any]) -> Task | None:
    from rl_conductor.tasks.graders import normalize_text

    kind = r["task_name"]
    if kind not in LLMROUTER_TASKS:
        return None
    domain, grader = LLMROUTER_TASKS[kind]
    gt, query = str(r["ground_truth"]), str(r["query"])
    meta: dict[str, Any] = {"task_name": kind}
    question, answer = query, gt
    if kind == "math":
        answer = _boxed_gold(gt) or ""
        meta["ref_len"] = len(gt)
    elif kind == "gsm8k":
        answer = _gsm8k_gold(gt) or ""
        meta["ref_len"] = len(gt)
    elif grader == "choice":
        parsed = _parse_choices(r["choices"], gt.strip())
        if parsed is None:
            return None
        choices, answer = parsed
        question = format_choices(query, choices)
        meta["choices"] = choices
    elif grader == "qa":
        if not normalize_text(gt):
            return None
        meta["aliases"] = [gt]
    elif kind == "human_eval":
        row = refs["humaneval"].get(str(r["task_id"]))
        if row is None:
            return None
        base = _humaneval_task(task_id, "llmrouter", row)
        return Task(**{**base.to_dict(), "metadata": {**base.metadata, **meta}})
    elif kind == "mbpp":
        try:
            tests = tuple(ast.literal_eval(gt))
        except (ValueError, SyntaxError):
            return None
        row = refs["mbpp"].get(tests)
        if row is None:
            return None
        base = _mbpp_task(task_id, "llmrouter", query, row)
        return Task(**{**base.to_dict(), "metadata": {**base.metadata, **meta}})
    if not answer:
        return None
    return Task(
        id=task_id, question=question, answer=answer, domain=domain, source="llmrouter", grader=grader,
        metadata=meta,
    )  # fmt: skip


@register_dataset("llmrouter")
def load_llmrouter() -> list[Task]:
    """LLMRouter's mixed query set (train + test files merged, duplicate queries dropped).

    Task types map to domains and graders as in ``LLMROUTER_TASKS``: math / gsm8k /
    agentverse-mgsm are math; mmlu / arc_challenge / openbook_qa are knowledge (choice);
    natural_qa / trivia_qa are knowledge graded by ``qa`` (their gold strings are noisy
    normalised titles, so exact match is strict); commonsense_qa and agentverse-logicgrid are
    reasoning (choice); mbpp / human_eval are code.

    Dropped rows, because they cannot be verified automatically here: all of ``commongen``
    (open-ended generation scored by concept coverage); ``mbpp`` rows whose tests do not match a
    row of MBPP-sanitized (LLMRouter ships tests but no reference solution, and the grader's
    gold must be a solution that passes); any row whose gold cannot be extracted.
    Ids are ``llmrouter/<file>-<row>`` with ``<file>`` ``train`` or ``test``.
    """
    refs: dict[str, Any] = {
        "humaneval": {r["task_id"]: r for r in read_jsonl("humaneval_test.jsonl.gz")},
        "mbpp": {tuple(r["test_list"]): r for r in read_jsonl("mbpp_sanitized_test.jsonl.gz")},
    }
    tasks, seen = [], set()
    for part in ("train", "test"):
        for i, r in enumerate(read_jsonl(f"llmrouter_mixed_{part}.jsonl.gz")):
            key = (r["task_name"], r["query"])
            if key in seen:
                continue
            seen.add(key)
            task = _llmrouter_row(f"llmrouter/{part}-{i}", r, refs)
            if task is not None:
                tasks.append(task)
    return tasks


# --------------------------------------------------------------------------- paper-mix


def cap_by_hash(tasks: list[Task], cap: int, salt: str) -> list[Task]:
    """At most ``cap`` tasks, chosen by a salted id hash (independent of the split hash)."""
    if len(tasks) <= cap:
        return list(tasks)
    keep = set(sorted((t.id for t in tasks), key=lambda i: hash_fraction(f"{salt}:{i}"))[:cap])
    return [t for t in tasks if t.id in keep]


@register_dataset("paper-mix")
def load_paper_mix() -> list[Task]:
    """The default benchmark: the paper's four in-domain domains, balanced.

    math = math500 (MATH500), knowledge = mmlu_stem (MMLU), reasoning = llmrouter's reasoning
    rows (stand-in for RLPR), code = mbpp + humaneval (stand-in for LiveCodeBench); each domain
    capped at ``PAPER_MIX_DOMAIN_CAP`` by a salted hash of the id, so a domain average and the
    four-domain average are comparable with the paper's four-benchmark average.
    """
    parts = {
        "math": list(load_tasks("math500")),
        "knowledge": list(load_tasks("mmlu_stem")),
        "reasoning": [t for t in load_tasks("llmrouter") if t.domain == "reasoning"],
        "code": list(load_tasks("mbpp")) + list(load_tasks("humaneval")),
    }
    out: list[Task] = []
    for domain, tasks in parts.items():
        out += cap_by_hash(tasks, PAPER_MIX_DOMAIN_CAP, salt=f"paper-mix/{domain}")
    return out
