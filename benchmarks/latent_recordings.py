"""A bring-your-own recordings file whose outcomes share a latent per-item difficulty.

Why: the project's other development files draw each worker's outcome independently
(``sim_recordings.py``: a worker's domain skill and a hash of the item), so nothing about a
question says how hard it is for everyone. Real recordings are not like that: hard items are
wrong for most models, easy ones right for most, wrong models often agree on the same plausible
wrong answer, and the question's text says something about its difficulty. A Conductor (and a
router) behaves differently on such a file; an outside tester built the first one of these for
issue 21 and found the fixed cascade beating the chosen Conductor there. This script writes
that file reproducibly: eleven made-up workers (frontier API models to small self-hosted ones,
with a skill per domain), GSM8K (``math``, gold answers), MMLU-STEM (``stem``, choice letters)
and MATH-500 (``competition``, labels and boxed texts but *no* gold answer) questions from the
package's task files. Each item's difficulty is read from its text (solution steps and length;
subject and length; level) plus noise; a worker is right with probability
``sigmoid(skill[domain] - difficulty + noise)``; a wrong worker picks one of three shared wrong
answers (the first most often); output tokens grow with difficulty and cost is tokens at the
pool's prices. Two thirds of the GSM8K items carry a ``split`` field, the rest split by id hash.

Read results on it as a stress test of correlated difficulty, not as a measurement of any real
model. Usage: ``python benchmarks/latent_recordings.py --out .conductor/bench/latent``
(writes ``<out>.jsonl`` and ``<out>.yaml``; seconds).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import random
import re
from pathlib import Path
from typing import Any

import yaml

TASKS = Path(__file__).resolve().parents[1] / "src" / "rl_conductor" / "data" / "tasks"
#: name -> (price in, price out per 1M tokens, hosting, typical output tokens, skill per domain)
WORKERS: dict[str, tuple[float, float, str, int, dict[str, float]]] = {
    "gpt-5": (1.25, 10.0, "external", 900, {"math": 3.2, "stem": 2.6, "competition": 2.4}),
    "claude-opus-4": (15.0, 75.0, "external", 600, {"math": 3.0, "stem": 2.8, "competition": 1.9}),
    "gemini-2.5-pro": (1.25, 10.0, "external", 1100, {"math": 3.1, "stem": 2.5, "competition": 2.2}),
    "deepseek-v3": (0.27, 1.10, "external", 500, {"math": 2.6, "stem": 2.0, "competition": 1.3}),
    "llama-3.3-70b": (0.60, 0.80, "self", 350, {"math": 2.0, "stem": 1.7, "competition": 0.2}),
    "qwen2.5-72b": (0.40, 0.80, "self", 420, {"math": 2.5, "stem": 1.6, "competition": 0.9}),
    "mixtral-8x22b": (0.60, 0.60, "self", 300, {"math": 1.2, "stem": 1.5, "competition": -0.6}),
    "qwen3-32b": (0.10, 0.20, "self", 650, {"math": 2.4, "stem": 1.3, "competition": 1.0}),
    "gemma-2-27b": (0.08, 0.16, "self", 280, {"math": 1.4, "stem": 1.2, "competition": -0.5}),
    "llama-3.1-8b": (0.02, 0.04, "self", 250, {"math": 0.5, "stem": 0.4, "competition": -1.5}),
    "phi-3-mini": (0.01, 0.02, "self", 220, {"math": 0.6, "stem": 0.0, "competition": -1.4}),
}
HARD_SUBJECTS = ("college", "abstract", "electrical", "machine", "formal")


def _load(name: str) -> list[dict[str, Any]]:
    with gzip.open(TASKS / f"{name}.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _responses(rng: random.Random, question: str, difficulty: float, domain: str, right: str,
               wrong: list[str], say: Any) -> dict[str, Any]:  # fmt: skip
    out = {}
    weights = [0.6, 0.25, 0.15][: len(wrong)]
    for name, (p_in, p_out, hosting, typical, skill) in WORKERS.items():
        ok = rng.random() < 1 / (1 + math.exp(-(skill[domain] - difficulty + rng.gauss(0, 0.35))))
        answer = right if ok else rng.choices(wrong, weights=weights)[0]
        grow = 0.6 + 0.5 * difficulty if difficulty > 0 else 0.6
        out_tok = min(3800, max(20, int(typical * grow * math.exp(rng.gauss(0, 0.3)))))
        in_tok = int(len(question) / 3.8) + 18
        words = ["First,", "Then", "So", "Next,", "Therefore"]
        steps = " ".join(f"{rng.choice(words)} we compute." for _ in range(rng.randint(1, 4)))
        out[name] = {
            "text": f"Let me work through this step by step. {steps}\n{say(answer)}",
            "correct": ok,
            "input_tokens": in_tok,
            "output_tokens": out_tok,
            "cost_usd": round((in_tok * p_in + out_tok * p_out) / 1e6, 8),
            "latency_s": round(0.4 + out_tok / (40 if hosting == "self" else 70), 3),
        }
    return out


def items(seed: int, n_math: int = 700, n_stem: int = 620, n_comp: int = 400) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    gsm, mmlu, comp = _load("gsm8k_test"), _load("mmlu_stem_test"), _load("math500_test")
    for rows in (gsm, mmlu, comp):
        rng.shuffle(rows)
    out: list[dict[str, Any]] = []
    for i, r in enumerate(gsm[:n_math]):
        q, gold = r["question"], r["answer"].split("####")[-1].strip().replace(",", "")
        diff = -1.0 + 0.45 * r["answer"].count("<<") + len(q) / 600 + rng.gauss(0, 0.7)
        g = float(gold)
        near = (
            str(int(g + rng.choice([-1, 1]) * max(1, round(abs(g) * 0.1))))
            if g.is_integer()
            else str(round(g * 1.1, 2))
        )
        wrong = [
            w
            for w in (near, str(int(g * 2)) if g.is_integer() else str(g * 2), str(rng.randint(1, 200)))
            if w != gold
        ]
        item = {"id": f"gsm/{i:04d}", "question": q, "answer": gold, "grader": "math", "domain": "math",
                "source": "gsm8k", "responses": _responses(rng, q, diff, "math", gold, wrong or ["0"],
                                                           lambda a: f"#### {a}")}  # fmt: skip
        if i % 3:
            h = int(hashlib.sha256(f"s{i}".encode()).hexdigest(), 16) % 100
            item["split"] = "train" if h < 60 else "validation" if h < 75 else "test"
        out.append(item)
    letters = "ABCD"
    for i, r in enumerate(mmlu[:n_stem]):
        choices = r["choices"]
        q = r["question"].strip() + "\n" + "\n".join(f"{letters[k]}. {c}" for k, c in enumerate(choices))
        gold = letters[r["answer"]]
        hard = 0.9 if r["type"].startswith(HARD_SUBJECTS) else 0.0
        diff = -0.8 + hard + len(q) / 500 + len(re.findall(r"\d+(?:\.\d+)?", q)) * 0.08 + rng.gauss(0, 0.8)
        wrong = [x for x in letters[: len(choices)] if x != gold]
        rng.shuffle(wrong)
        said = _responses(rng, q, diff, "stem", gold, wrong, lambda a: f"Answer: {a}")
        out.append({"id": f"stem/{i:04d}", "question": q, "answer": gold, "grader": "choice",
                    "domain": "stem", "source": "mmlu_stem",
                    "metadata": {"choices": choices, "subject": r["type"]}, "responses": said})  # fmt: skip
    for i, r in enumerate(comp[:n_comp]):  # labels only: no gold answer
        q, gold = r["problem"], r["answer"]
        diff = -1.2 + 0.55 * r["level"] + len(q) / 800 + rng.gauss(0, 0.6)
        wrong = [
            w
            for w in (gold + "+1", "2" + gold if len(gold) < 6 else "0", str(rng.randint(2, 99)))
            if w != gold
        ]
        out.append({"id": f"comp/{i:04d}", "question": q, "domain": "competition", "grader": "math",
                    "source": "math500", "metadata": {"level": r["level"]},
                    "responses": _responses(rng, q, diff, "competition", gold, wrong,
                                            lambda a: f"The final answer is $\\boxed{{{a}}}$.")})  # fmt: skip
    rng.shuffle(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.jsonl and OUT.yaml")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    rows = items(args.seed)
    rec = args.out.with_suffix(".jsonl")
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pool = {"name": f"latent-{args.seed}", "recordings": str(rec.resolve()), "workers": [
        {"name": n, "kind": "replay", "price_in": p_in, "price_out": p_out, "hosting": h,
         "description": "hosted frontier/API model" if h == "external" else "self-hosted open model"}
        for n, (p_in, p_out, h, _, _) in WORKERS.items()]}  # fmt: skip
    args.out.with_suffix(".yaml").write_text(yaml.safe_dump(pool, sort_keys=False), encoding="utf-8")
    print(f"wrote {rec} and {args.out.with_suffix('.yaml')} ({len(rows)} items, {len(WORKERS)} workers)")


if __name__ == "__main__":
    main()
