"""An outside tester's recordings file (H36, 2026-12-07), kept so that its figures can be rebuilt.

Written by a helper acting as a new user, from the docs alone, in a shape the presets were not
tuned on; the figures it gave are in docs/recordings.md ("On files the presets were not tuned on")
and benchmarks/results/byo_unseen_h36.json. Only the questions, tests and reference programs are
real (the shipped task files); which model is right is drawn as below.

11 workers over three benchmarks (code: HumanEval+MBPP with real tests, GSM8K, MMLU-STEM),
~3,000 items, train/test split only (70/30). Correctness from per-question difficulty computed
from question features + a hidden per-question noise shared by all models (so errors correlate),
per-(model, domain) skill, and per-(model, question) noise. Wrong answers are drawn from a small
per-item set of distractors with a dominant "attractive" one (correlated wrong answers).
Three models record labels only; the rest texts + labels. Two models miss some items.
Code: a right program is the reference solution (passes), a wrong one is a broken variant that is
verified to FAIL the item's tests here (subprocess, timeout).

Usage: python benchmarks/unseen_recordings_h36.py OUT_PREFIX   -> OUT_PREFIX.jsonl.gz, prints a summary
(then write the pool file of docs/recordings.md with the prices printed here, or see the JSON's
``pool``). It runs each code item's reference program and broken variants in a subprocess (the
shipped items only), cached in ``runs/unseen_h36_code_cache.json``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "src" / "rl_conductor" / "data" / "tasks"
rng = random.Random(36)


def rows(name):
    with gzip.open(TASKS / name, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def h01(*parts) -> float:
    s = hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()
    return int(s[:12], 16) / 16**12


def gauss(*parts) -> float:
    u1 = max(1e-12, h01("g1", *parts))
    u2 = h01("g2", *parts)
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def ntok(text: str) -> int:
    return max(1, len(text) // 4)


# ------------------------------------------------------------------ workers
# name: (price_in, price_out, texts?, skill per domain {code, math, science}, out-token factor, tps, ttft)
WORKERS = {
    "tinyllama-1b": (0.05, 0.10, True, {"code": -1.0, "math": -0.8, "science": -0.5}, 1.0, 180, 0.15),
    "llama-3.1-8b": (0.10, 0.10, False, {"code": -0.3, "math": 0.0, "science": 0.1}, 1.0, 150, 0.2),
    "gemma-2-9b": (0.12, 0.20, True, {"code": -0.4, "math": 0.2, "science": 0.4}, 1.0, 140, 0.2),
    "qwen2.5-coder-32b": (0.20, 0.60, True, {"code": 1.55, "math": 0.0, "science": -0.4}, 1.1, 90, 0.3),
    "qwen2.5-math-72b": (0.40, 1.20, True, {"code": -0.5, "math": 1.75, "science": 0.3}, 1.3, 60, 0.4),
    "mistral-small-24b": (0.20, 0.60, False, {"code": 0.1, "math": 0.3, "science": 0.5}, 1.0, 100, 0.3),
    "llama-3.3-70b": (0.60, 0.60, False, {"code": 0.5, "math": 0.8, "science": 1.0}, 1.0, 70, 0.4),
    "deepseek-v3": (0.27, 1.10, True, {"code": 1.1, "math": 1.2, "science": 1.2}, 1.2, 50, 0.8),
    "gpt-4o": (2.50, 10.0, True, {"code": 1.3, "math": 1.3, "science": 1.55}, 1.0, 80, 0.5),
    "claude-3.5-sonnet": (3.00, 15.0, True, {"code": 1.7, "math": 1.3, "science": 1.5}, 1.1, 70, 0.7),
    "o1": (15.0, 60.0, True, {"code": 1.6, "math": 1.75, "science": 1.6}, 6.0, 60, 4.0),
}
MISSING = {"o1": 0.09, "deepseek-v3": 0.025}  # share of items not recorded
SLOPE = 1.6


# ------------------------------------------------------------------ code verification
#: seconds a reference program may take: it is known good, so only a failure may drop its item
#: (mbpp-64's takes 3.6 s on a loaded 2-core machine, and a 3 s limit dropped it)
REFERENCE_TIMEOUT_S = 60.0


def run_prog(prog: str, timeout=3.0) -> bool:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(prog)
        p = f.name
    try:
        r = subprocess.run([sys.executable, p], capture_output=True, timeout=timeout)
        return r.returncode == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        Path(p).unlink(missing_ok=True)


def mutations(code: str, entry: str, header_src: str):
    """Broken variants of a reference program (candidates; verified by running the tests)."""
    out = []
    subs = [
        (r"<=", "<"),
        (r">=", ">"),
        (r"(?<![<>=!])<(?![<=])", "<="),
        (r"(?<![<>=!-])>(?![>=])", ">="),
        (r"\+ 1\b", ""),
        (r"- 1\b", ""),
        (r"\bTrue\b", "False"),
        (r"\breturn (\w+)\s*$", r"return not \1"),
    ]
    for pat, rep in subs:
        new, n = re.subn(pat, rep, code, count=1, flags=re.MULTILINE)
        if n and new != code:
            out.append(new)
        if len(out) >= 3:
            break
    # a stub that returns None
    out.append(header_src.rstrip() + "\n    return None\n")
    return out


def code_items():
    items = []
    for r in rows("humaneval_test.jsonl.gz"):
        tid = "he-" + r["task_id"].split("/")[-1]
        ref = r["prompt"] + r["canonical_solution"]
        test_prog = lambda prog, r=r: prog + "\n\n" + r["test"] + f"\n\ncheck({r['entry_point']})\n"  # noqa: E731
        # header: the prompt up to the end of the docstring of entry point = the prompt itself
        items.append(
            dict(
                id=tid,
                question="Complete the following Python function.\n\n```python\n" + r["prompt"] + "```",
                answer=ref,
                grader="code",
                domain="code",
                source="humaneval",
                metadata={"tests": r["test"], "entry_point": r["entry_point"], "prompt": r["prompt"]},
                _ref=ref,
                _test=test_prog,
                _header=r["prompt"],
                _feat=len(r["canonical_solution"]) / 400,
            )
        )
    for i, r in enumerate(rows("mbpp_sanitized_test.jsonl.gz")):
        tests = [str(t) for t in r["test_list"]]
        imports = [str(t) for t in r.get("test_imports") or []]
        m = re.search(r"def\s+([A-Za-z_]\w*)\s*\(", r.get("code_header") or r["code"])
        entry = m.group(1) if m else ""
        test_prog = lambda prog, tests=tests, imports=imports: (  # noqa: E731
            "\n".join(imports) + "\n" + prog + "\n\n" + "\n".join(tests) + "\n"
        )
        items.append(
            dict(
                id=f"mbpp-{i}",
                question=r["prompt"].strip() + "\nYour code should pass these tests:\n\n" + "\n".join(tests),
                answer=r["code"],
                grader="code",
                domain="code",
                source="mbpp",
                metadata={
                    "tests": tests,
                    "test_imports": imports,
                    "entry_point": entry,
                    "prompt": r["prompt"],
                },
                _ref=r["code"],
                _test=test_prog,
                _header=(r.get("code_header") or "def f():"),
                _feat=len(r["code"]) / 300,
            )
        )
    good = []
    for it in items:
        if not run_prog(it["_test"](it["_ref"]), timeout=REFERENCE_TIMEOUT_S):
            print("drop (reference fails here):", it["id"], file=sys.stderr)
            continue
        wrongs = []
        for v in mutations(it["_ref"], it["metadata"]["entry_point"], it["_header"]):
            if v not in wrongs and not run_prog(it["_test"](v)):
                wrongs.append(v)
            if len(wrongs) >= 3:
                break
        if not wrongs:
            print("drop (no failing variant):", it["id"], file=sys.stderr)
            continue
        it["_right_texts"] = [it["_ref"]]
        it["_wrong_texts"] = wrongs
        it["_diff"] = -0.2 + 1.3 * min(it["_feat"], 2.0) + (0.35 if it["source"] == "humaneval" else 0.0)
        good.append(it)
    return good


def fmt_num(x):
    if abs(x - round(x)) < 1e-9:
        return str(round(x))
    return f"{x:.2f}".rstrip("0").rstrip(".")


def gsm_items(n):
    out = []
    for i, r in enumerate(rows("gsm8k_test.jsonl.gz")[:n]):
        sol = r["answer"]
        gold = re.search(r"####\s*(.+)\s*$", sol.strip()).group(1).replace(",", "").strip()
        try:
            g = float(gold)
        except ValueError:
            continue
        steps = sol.count("<<")
        inter = [m for m in re.findall(r"=\s*([-\d.]+)>>", sol)]
        cands = []
        for v in inter:
            try:
                fv = float(v)
            except ValueError:
                continue
            if abs(fv - g) > 1e-9:
                cands.append(fmt_num(fv))
        cands += [fmt_num(g * 2), fmt_num(g + 10), fmt_num(max(0, g - 1))]
        wrong = []
        for c in cands:
            if c not in wrong and c != fmt_num(g):
                wrong.append(c)
        wrong = wrong[:3]
        body = re.sub(r"<<[^>]*>>", "", sol.rsplit("####", 1)[0]).strip()
        right_texts = [
            body + f"\n#### {gold}",
            "Let's think step by step.\n" + body + f"\nThe answer is {gold}.",
        ]
        wrong_texts = [
            [
                body.rsplit("\n", 1)[0] + f"\nSo the total is {w}.\n#### {w}",
                "Let's think step by step.\n" + body.rsplit("\n", 1)[0] + f"\nThe answer is {w}.",
            ]
            for w in wrong
        ]
        diff = -1.0 + 0.38 * steps + 0.0015 * len(r["question"])
        out.append(
            dict(
                id=f"gsm-{i}",
                question=r["question"],
                answer=gold,
                grader="math",
                domain="math",
                source="gsm8k",
                metadata={"steps": steps},
                _right_texts=right_texts,
                _wrong_sets=wrong_texts,
                _diff=diff,
            )
        )
    return out


def mmlu_items(n):
    rs = rows("mmlu_stem_test.jsonl.gz")
    idx = list(range(len(rs)))
    rng.shuffle(idx)
    out = []
    for i in sorted(idx[:n]):
        r = rs[i]
        L = "ABCD"
        gold = L[int(r["answer"])]
        others = [c for c in L[: len(r["choices"])] if c != gold]
        att = others[int(h01("att", i) * len(others))]
        rest = [c for c in others if c != att]
        subj = r["type"]
        base = {
            "elementary": -0.8,
            "high_school": 0.0,
            "college": 0.7,
            "conceptual": -0.3,
            "astronomy": -0.2,
            "electrical": 0.4,
            "machine": 0.5,
            "abstract": 1.2,
            "computer": 0.2,
        }
        diff = next((v for k, v in base.items() if subj.startswith(k)), 0.0)
        diff += 0.002 * len(r["question"]) + (0.6 if "mathematics" in subj or "statistics" in subj else 0)
        q = r["question"].rstrip() + "\n\n" + "\n".join(f"{L[k]}. {c}" for k, c in enumerate(r["choices"]))
        out.append(
            dict(
                id=f"mmlu-{i}",
                question=q,
                answer=gold,
                grader="choice",
                domain="science",
                source="mmlu-stem",
                metadata={"choices": r["choices"], "subject": subj},
                _gold=gold,
                _att=att,
                _rest=rest,
                _choices=r["choices"],
                _diff=diff - 0.6,
            )
        )
    return out


def cached_code_items():
    cache = ROOT / "runs" / "unseen_h36_code_cache.json"
    if cache.exists():
        return json.loads(cache.read_text())
    its = code_items()
    for it in its:
        it.pop("_test", None)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(its))
    return its


def build(prefix: str):
    items = cached_code_items() + gsm_items(1250) + mmlu_items(1330)
    lines = []
    acc = {m: [0, 0] for m in WORKERS}
    oracle = 0
    for it in items:
        dom = it["domain"]
        hidden = 0.75 * gauss("hid", it["id"])  # shared by all models: correlated errors
        d = it["_diff"] + hidden
        resp = {}
        any_right = False
        # one "attractive" wrong answer dominates
        for m, (pi, po, texts, skill, ofac, tps, ttft) in WORKERS.items():
            if m in MISSING and h01("miss", m, it["id"]) < MISSING[m]:
                continue
            z = SLOPE * (skill[dom] - d) + 1.0 * gauss("mq", m, it["id"])
            ok = z > 0
            any_right |= ok
            acc[m][0] += ok
            acc[m][1] += 1
            r = {"correct": bool(ok)}
            if texts:
                k = int(h01("style", m) * 2)
                if dom == "code":
                    if ok:
                        body = it["_right_texts"][0]
                    else:
                        ws = it["_wrong_texts"]
                        j = 0 if h01("wc", m, it["id"]) < 0.65 else int(h01("wj", m, it["id"]) * len(ws))
                        body = ws[j]
                    text = "Here is the implementation:\n\n```python\n" + body.rstrip() + "\n```"
                elif dom == "math":
                    if ok:
                        text = it["_right_texts"][k]
                    else:
                        ws = it["_wrong_sets"]
                        j = 0 if h01("wc", m, it["id"]) < 0.6 else int(h01("wj", m, it["id"]) * len(ws))
                        text = ws[j][k]
                else:
                    if ok:
                        letter = it["_gold"]
                    elif h01("wc", m, it["id"]) < 0.6 or not it["_rest"]:
                        letter = it["_att"]
                    else:
                        letter = it["_rest"][int(h01("wj", m, it["id"]) * len(it["_rest"]))]
                    opt = it["_choices"]["ABCD".index(letter)]
                    text = f"Considering the options, {opt} fits best.\nAnswer: {letter}"
                r["text"] = text
                out_tok = ntok(text)
            else:
                out_tok = {"code": 160, "math": 180, "science": 40}[dom] + int(60 * h01("ot", m, it["id"]))
            out_tok = int(out_tok * ofac)
            in_tok = ntok(it["question"]) + 24
            r["input_tokens"] = in_tok
            r["output_tokens"] = out_tok
            r["cost_usd"] = round((in_tok * pi + out_tok * po) / 1e6, 8)
            r["latency_s"] = round(ttft + out_tok / tps * (0.8 + 0.4 * h01("lat", m, it["id"])), 3)
            resp[m] = r
        oracle += any_right
        split = "train" if h01("split", it["id"]) < 0.7 else "test"
        lines.append(
            {
                "id": it["id"],
                "split": split,
                "question": it["question"],
                "answer": it["answer"],
                "grader": it["grader"],
                "domain": dom,
                "source": it["source"],
                "metadata": it["metadata"],
                "responses": resp,
            }
        )
    # no time or file name in the gzip header: the same content gives the same bytes
    with (
        open(prefix + ".jsonl.gz", "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
    ):
        for item in lines:
            gz.write((json.dumps(item) + "\n").encode("utf-8"))
    n = len(lines)
    print(f"items {n}; oracle (any right) {oracle / n:.3f}")
    from collections import Counter

    print(Counter(item["domain"] for item in lines), Counter(item["split"] for item in lines))
    for m, (a, t) in acc.items():
        per = {}
        for dom in ("code", "math", "science"):
            xs = [
                item["responses"][m]["correct"]
                for item in lines
                if item["domain"] == dom and m in item["responses"]
            ]
            per[dom] = sum(xs) / max(1, len(xs))
        print(f"{m:20s} {a / t:.3f} n={t} " + " ".join(f"{k}={v:.3f}" for k, v in per.items()))


if __name__ == "__main__":
    build(sys.argv[1])
